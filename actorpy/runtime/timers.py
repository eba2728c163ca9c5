"""Timers of a node's I/O loop: a heap of ``(due, seq, handle)`` that any thread may add to
and only the loop pops (so a timer's callback always runs on the I/O thread)."""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Callable

from actorpy.clock import TimerHandle

__all__ = ["TimerHandle", "TimerQueue"]


class TimerQueue:
    """Thread-safe timer heap. Cancelled handles are dropped when they reach the top."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def add(self, delay_s: float, callback: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle(callback)
        with self._lock:
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay_s), next(self._seq),
                                        handle))
        return handle

    def pop_due(self, now: float) -> TimerHandle | None:
        """The earliest live timer due at ``now``, removed from the heap (None if none is due)."""
        with self._lock:
            while self._heap:
                due, _, handle = self._heap[0]
                if handle.cancelled:
                    heapq.heappop(self._heap)
                    continue
                if due > now:
                    return None
                heapq.heappop(self._heap)
                return handle
        return None

    def next_due(self) -> float | None:
        """When the earliest live timer is due (monotonic seconds), or None."""
        with self._lock:
            while self._heap and self._heap[0][2].cancelled:
                heapq.heappop(self._heap)
            return self._heap[0][0] if self._heap else None

    def clear(self) -> None:
        with self._lock:
            self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)

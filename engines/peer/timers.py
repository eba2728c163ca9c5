"""A service's many timers on one runtime timer: ``TimerHeap``.

A peer sets a timer per request it sends (its RPC timeout), most of them stale by the time
they fall due. Each ``ctx.schedule`` wakes the node's I/O thread to arm it and again to fire
it, so the shell keeps its timers in a heap and arms one ``ctx.schedule`` for the earliest;
timers of equal delay arm nothing new (a later one never comes first).
"""
from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable


class TimerHeap:
    """Timers due at given times, fired in order on the service's thread.

    Args:
        ctx: the service's context (its ``schedule``).
        now: the clock the due times are on.
        fire: called on the service thread with the items due, in order of due time.
    """

    def __init__(self, ctx: Any, now: Callable[[], float],
                 fire: Callable[[list[Any]], None]) -> None:
        self._ctx = ctx
        self._now = now
        self._fire = fire
        self._heap: list[tuple[float, int, Any]] = []
        self._seq = itertools.count()
        self._armed: tuple[float, Any] | None = None   # (due, ServiceTimer)

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, due: float, item: Any) -> None:
        """Fire ``item`` at ``due`` (or soon after)."""
        heapq.heappush(self._heap, (due, next(self._seq), item))
        if self._armed is None or due < self._armed[0]:
            self._arm()

    def _arm(self) -> None:
        if self._armed is not None:
            self._armed[1].cancel()
        due = self._heap[0][0]
        self._armed = (due, self._ctx.schedule(max(0.0, due - self._now()), self._sweep))

    def _sweep(self) -> None:
        self._armed = None
        now = self._now()
        due = []
        while self._heap and self._heap[0][0] <= now:
            due.append(heapq.heappop(self._heap)[2])
        if self._heap:
            self._arm()
        self._fire(due)

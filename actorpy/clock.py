"""Clocks. Code that needs time takes a Clock, so tests and the simulators can run on
virtual time (FakeClock) while processes run on the system clock."""
from __future__ import annotations

import heapq
import itertools
import time
from typing import Callable, Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """What protocol code may know about time."""

    def now(self) -> float:
        """Seconds on a monotonic scale (only differences are meaningful)."""
        ...

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` once, ``delay_s`` seconds from now."""
        ...


class SystemClock:
    """Monotonic wall time. ``call_later`` is not provided: processes run timers in their
    own event loop (see actorpy.runtime.node), so this clock only tells the time."""

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        raise NotImplementedError("SystemClock has no timer loop; use the node's loop")


class TimerHandle:
    """A pending timer (FakeClock's, and a node's ``call_later``); ``cancel()`` stops it if
    it has not run yet. Heaps order ``(due, seq, handle)`` tuples, so comparisons stay in C
    (the simulators push millions of them)."""

    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        """Stop it, and let go of its callback at once: a cancelled handle stays in its heap
        until its due time, and the callback's closure with it (a stopped service's timers
        held the whole service, its data included, until they were due: 200 MB a P2P
        job's peer, workers grew by gigabytes over a benchmark)."""
        self.cancelled = True
        self.callback = _noop


def _noop() -> None:
    pass


class FakeClock:
    """Virtual time for tests and simulators: time moves only when ``advance`` is called.

    >>> clock = FakeClock()
    >>> fired = []
    >>> _ = clock.call_later(2.0, lambda: fired.append(clock.now()))
    >>> clock.advance(1.0); fired
    []
    >>> clock.advance(1.5); fired
    [2.0]
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._queue: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> TimerHandle:
        entry = TimerHandle(callback)
        heapq.heappush(self._queue, (self._now + max(0.0, delay_s), next(self._seq), entry))
        return entry

    def next_due(self) -> float | None:
        """Time of the earliest pending timer, or None."""
        while self._queue and self._queue[0][2].cancelled:
            heapq.heappop(self._queue)
        return self._queue[0][0] if self._queue else None

    def advance(self, delta_s: float) -> None:
        """Move time forward by ``delta_s``, firing due timers in order (each at its due time)."""
        self.run_until(self._now + delta_s)

    def run_until(self, t: float) -> None:
        """Fire every timer due at or before ``t``, then set the time to ``t``."""
        while True:
            due = self.next_due()
            if due is None or due > t:
                break
            _, _, entry = heapq.heappop(self._queue)
            self._now = max(self._now, due)
            entry.callback()
        self._now = max(self._now, t)

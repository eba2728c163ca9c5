"""A service's many timers on one runtime timer: ``TimerHeap``.

A peer sets a timer per request it sends (its RPC timeout), most of them stale by the time
they fall due. Each ``ctx.schedule`` wakes the node's I/O thread to arm it and again to fire
it, so the shell keeps its timers in a heap and arms one ``ctx.schedule`` for the earliest;
timers of equal delay arm nothing new (a later one never comes first).

Most of a peer's timers are stale when they fall due (an RPC timeout of an answered request, a
barrier re-check of a step long begun) and a stepping peer sets one or two per step, so one
sweep per timer would wake the I/O thread and the service thread about once per step for
nothing. Timers may fire up to ``SLACK_S`` late instead: a timer due within ``SLACK_S`` of the
armed one arms nothing new, and after a sweep the next one is armed at least ``SLACK_S``
later, so the timers due meanwhile go in one sweep. Every timer a peer sets is a timeout or a
fallback poll of 10 ms or more (the ones due at once are posted, not set here), so 5 ms late
changes no decision, only when a stale one is thrown away.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable

#: how late a timer may fire so that timers due close together share one sweep
SLACK_S = 0.005


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
        """Fire ``item`` at ``due`` or at most ``SLACK_S`` after."""
        heapq.heappush(self._heap, (due, next(self._seq), item))
        if self._armed is None or due < self._armed[0] - SLACK_S:
            self._arm(due)

    def clear(self) -> None:
        """Drop every timer and disarm (the service stopped)."""
        self._heap.clear()
        if self._armed is not None:
            self._armed[1].cancel()
            self._armed = None

    def _arm(self, at: float) -> None:
        if self._armed is not None:
            self._armed[1].cancel()
        self._armed = (at, self._ctx.schedule(max(0.0, at - self._now()), self._sweep))

    def _sweep(self) -> None:
        self._armed = None
        now = self._now()
        due = []
        while self._heap and self._heap[0][0] <= now:
            due.append(heapq.heappop(self._heap)[2])
        if self._heap:
            self._arm(max(self._heap[0][0], now + SLACK_S))
        self._fire(due)

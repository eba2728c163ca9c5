"""The shell's timers: many on one runtime timer, fired in order of due time."""
from __future__ import annotations

from typing import Any, Callable

from engines.peer.timers import TimerHeap


class FakeTimer:
    def __init__(self, due: float, fn: Callable[[], None]) -> None:
        self.due, self.fn, self.cancelled = due, fn, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeCtx:
    """A service context whose ``schedule`` runs nothing until ``advance``."""

    def __init__(self) -> None:
        self.now = 0.0
        self.armed: list[FakeTimer] = []

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> FakeTimer:
        timer = FakeTimer(self.now + delay_s, fn)
        self.armed.append(timer)
        return timer

    def advance(self, to: float) -> None:
        while True:
            due = [t for t in self.armed if not t.cancelled and t.due <= to]
            if not due:
                break
            timer = min(due, key=lambda t: t.due)
            self.armed.remove(timer)
            self.now = timer.due
            timer.fn()
        self.now = to


def test_equal_delays_arm_one_runtime_timer_and_fire_in_order() -> None:
    ctx = FakeCtx()
    fired: list[Any] = []
    heap = TimerHeap(ctx, lambda: ctx.now, fired.extend)
    for i in range(100):                      # an RPC timeout per request, 0.5 s each
        ctx.now = i * 0.001
        heap.add(ctx.now + 0.5, i)
    assert len(ctx.armed) == 1 and len(heap) == 100
    ctx.advance(0.55)
    assert fired == list(range(51)) and len(heap) == 49
    ctx.advance(1.0)
    assert fired == list(range(100)) and len(heap) == 0 and not ctx.armed


def test_an_earlier_timer_rearms_and_the_later_ones_still_fire() -> None:
    ctx = FakeCtx()
    fired: list[Any] = []
    heap = TimerHeap(ctx, lambda: ctx.now, fired.extend)
    heap.add(1.0, "late")
    heap.add(0.2, "early")                    # cancels the armed 1.0 s timer, arms 0.2 s
    assert [t.cancelled for t in ctx.armed] == [True, False]
    ctx.advance(0.5)
    assert fired == ["early"]
    heap.add(0.7, "middle")
    ctx.advance(2.0)
    assert fired == ["early", "middle", "late"]


def test_timers_due_close_together_share_a_sweep_and_none_fires_more_than_slack_late() -> None:
    """A stepping peer sets a timer per step (an RPC timeout, a barrier re-check), most of
    them stale when due: one sweep each would wake two threads per step for nothing."""
    from engines.peer.timers import SLACK_S

    ctx = FakeCtx()
    fired: list[tuple[int, float]] = []
    heap = TimerHeap(ctx, lambda: ctx.now, lambda items: fired.extend((i, ctx.now) for i in items))
    due = {}
    for i in range(200):                      # one timer per 0.5 ms step, 0.1 s out
        ctx.advance(i * 0.0005)
        due[i] = ctx.now + 0.1
        heap.add(due[i], i)
    ctx.advance(1.0)
    assert [i for i, _ in fired] == list(range(200))      # all of them, in order
    assert all(due[i] <= at <= due[i] + SLACK_S + 1e-9 for i, at in fired)
    sweeps = len({at for _, at in fired})
    assert sweeps <= 0.1 / SLACK_S + 2, sweeps            # one per SLACK_S, not per timer


def test_an_earlier_timer_within_the_slack_arms_nothing_new() -> None:
    from engines.peer.timers import SLACK_S

    ctx = FakeCtx()
    fired: list[Any] = []
    heap = TimerHeap(ctx, lambda: ctx.now, fired.extend)
    heap.add(1.0, "armed")
    heap.add(1.0 - SLACK_S / 2, "close")      # fires with the armed one, a little late
    heap.add(0.5, "early")                    # far earlier: re-arms
    assert [t.cancelled for t in ctx.armed] == [True, False]
    ctx.advance(0.6)
    assert fired == ["early"]
    ctx.advance(1.0 + SLACK_S)
    assert fired == ["early", "close", "armed"]

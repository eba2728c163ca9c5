"""DSSP's synchronisation controller (Zhao, An, Liu, Chen, ICDCS 2019, Algorithm 1).

A plain object fed measurements: the engine (or the simulator) reports each push with its
timestamp, taken from whatever clock it owns; the controller never reads a clock.

Rule used here. A worker advances while ``c - min <= low + granted``. When the *fastest*
worker pushes and finds itself more than ``low`` ahead of the slowest, the controller
predicts, from the recent push intervals, when the slowest will next be within ``low`` of
it, and grants the ``r`` in ``[0, high - low]`` that minimises the fastest's predicted wait
at the end of those r steps (ties go to the smaller r: less staleness for the same wait).
A grant lasts until the worker is back within ``low`` of the slowest. Because the bound is
``low + r <= high``, nobody is ever let more than ``high`` ahead.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Mapping

from actorpy.barrier.policy import DSSP, Decision
from actorpy.barrier.view import StepView
from actorpy.errors import ConfigError
from actorpy.ids import NodeId


@dataclass(frozen=True)
class Grant:
    """A grant the controller made: ``extra`` steps beyond ``low`` and the predicted wait."""

    node: NodeId
    extra: int
    predicted_wait_s: float


class DSSPController:
    """Chooses each fastest worker's extra staleness from its push timestamps.

    Args:
        policy: the ``DSSP(low, high)`` bounds.
        window: how many recent push intervals predict a worker's iteration time.

    >>> from actorpy.barrier.view import FullView
    >>> c = DSSPController(DSSP(low=0, high=3))
    >>> for t in (0.0, 1.0):  # "fast" pushes every second, "slow" every 4 s
    ...     c.observe(NodeId("fast"), int(t), t)
    >>> c.observe(NodeId("slow"), 0, 0.0); c.observe(NodeId("slow"), 1, 4.0)
    >>> c.on_push(NodeId("fast"), 2, 2.0, FullView({NodeId("slow"): 1}))
    Decision(advance=True, waiting_on=())
    >>> c.granted(NodeId("fast"))  # slow's next push is due at 8 s: the largest grant waits least
    3
    """

    def __init__(self, policy: DSSP, window: int = 4) -> None:
        if window < 1:
            raise ConfigError(f"DSSP window must be >= 1, got {window}")
        self.policy = policy
        self._window = window
        self._pushes: dict[NodeId, deque[tuple[int, float]]] = {}
        self._granted: dict[NodeId, int] = {}

    def observe(self, node: NodeId, step: int, time_s: float) -> None:
        """Record that ``node`` completed ``step`` steps at ``time_s`` (any monotonic clock)."""
        history = self._pushes.setdefault(node, deque(maxlen=self._window + 1))
        history.append((step, time_s))

    def granted(self, node: NodeId) -> int:
        """The extra staleness ``node`` currently holds (0 if none)."""
        return self._granted.get(node, 0)

    def interval_s(self, node: NodeId) -> float | None:
        """Predicted seconds per step of ``node``: mean of its recent push intervals."""
        history = self._pushes.get(node)
        if not history or len(history) < 2:
            return None
        (step0, t0), (step1, t1) = history[0], history[-1]
        return (t1 - t0) / (step1 - step0) if step1 > step0 else None

    def choose_extra(self, node: NodeId, me_step: int, time_s: float,
                     slowest: NodeId, slowest_step: int) -> Grant:
        """The grant minimising ``node``'s predicted wait for ``slowest`` (pure).

        ``node`` will reach its barrier at ``time_s + r * I_fast``; it may go on once the
        slowest has completed ``me_step - low`` steps, predicted at
        ``t_slow + k * I_slow``. Without predictions the grant is 0 (plain SSP(low)).
        """
        fast_i, slow_i = self.interval_s(node), self.interval_s(slowest)
        history = self._pushes.get(slowest)
        if fast_i is None or slow_i is None or not history or fast_i <= 0:
            return Grant(node, 0, float("nan"))
        last_step, last_t = history[-1]
        needed = (me_step - self.policy.low) - last_step
        ready_at = last_t + max(needed, 0) * slow_i
        best = Grant(node, 0, max(0.0, ready_at - time_s))
        for extra in range(1, self.policy.max_extra + 1):
            wait = max(0.0, ready_at - (time_s + extra * fast_i))
            if wait < best.predicted_wait_s:
                best = Grant(node, extra, wait)
        return best

    def on_push(self, node: NodeId, me_step: int, time_s: float, view: StepView) -> Decision:
        """Record the push and decide; the fastest worker may receive a grant here.

        Args:
            node: the pushing worker; ``me_step`` its completed steps; ``time_s`` now.
            view: the other workers' steps (a server's ``FullView`` of its table).
        """
        self.observe(node, me_step, time_s)
        steps = view.steps()
        if not steps:
            return Decision(True, ())
        slowest_step, slowest = min((step, other) for other, step in steps.items())
        lag = me_step - slowest_step
        if lag <= self.policy.low:
            self._granted.pop(node, None)
        elif lag > self.policy.low + self.granted(node) and me_step >= max(steps.values()):
            grant = self.choose_extra(node, me_step, time_s, slowest, slowest_step)
            self._granted[node] = grant.extra
        return self.policy.decide(me_step, view, self.granted(node))

    def recheck(self, node: NodeId, me_step: int, view: StepView) -> Decision:
        """Re-decide for a blocked worker (after someone else pushed); grants no new steps."""
        return self.policy.decide(me_step, view, self.granted(node))

    def forget(self, node: NodeId) -> None:
        """Drop a worker that left (its history and grant)."""
        self._pushes.pop(node, None)
        self._granted.pop(node, None)


def max_lead(steps: Mapping[NodeId, int]) -> int:
    """How far the fastest is ahead of the slowest (0 for fewer than two workers).

    >>> max_lead({NodeId("a"): 3, NodeId("b"): 7})
    4
    """
    return max(steps.values()) - min(steps.values()) if len(steps) > 1 else 0

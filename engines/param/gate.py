"""The barrier as a server shard applies it: one policy from ``actorpy.barrier`` over the
shard's step table (sans-I/O: the caller passes the time).

* BSP / SSP(s): ``decide`` over a :class:`FullView` of the table;
* ASP: always advance;
* PSP(β, s): SSP(s) over a :class:`SampledView` of β others, freshly drawn at every check
  (a held worker re-samples whenever someone pushes), from the shard's seeded rng;
* DSSP(low, high): :class:`DSSPController` (grants from push times at each push, rechecks
  with the grant held);
* anything else with ``decide(me_step, view)`` (a custom policy, or a function registered
  with ``Job.register_barrier``): called with a FullView that can also ``sample``.

With several shards, shard 0 (the coordinator) applies the policy; the others apply the
deterministic bound it implies, so they never hold a worker the coordinator lets go:
BSP/SSP(s) the same (every shard then serves the same round), DSSP(low, high) SSP(high),
PSP, ASP and custom policies ASP (the coordinator's reply holds the worker).
"""
from __future__ import annotations

import random
from typing import Any, Mapping

from actorpy.barrier import ASP, DSSP, PSP, SSP, DSSPController, FullView, SampledView
from actorpy.ids import NodeId
from actorpy.values import as_decision
from engines.param.errors import CallbackError


def follower_policy(policy: Any) -> Any:
    """The policy a non-coordinator shard applies for ``policy`` (see the module docstring).

    >>> follower_policy(DSSP(low=1, high=4)), follower_policy(PSP(sample=2, staleness=1))
    (SSP(staleness=4), ASP())
    """
    if isinstance(policy, SSP):
        return policy
    if isinstance(policy, DSSP):
        return SSP(staleness=policy.high)
    return ASP()


class Gate:
    """Barrier decisions for one shard.

    Args:
        policy: a barrier policy (see the module docstring).
        rng: the source of PSP's samples (seeded by the job).
    """

    def __init__(self, policy: Any, rng: random.Random) -> None:
        if not callable(getattr(policy, "decide", None)):
            raise TypeError(f"a barrier needs decide(me_step, view); got {policy!r}")
        self.policy = policy
        self._rng = rng
        self._dssp = DSSPController(policy) if isinstance(policy, DSSP) else None

    def on_push(self, worker: NodeId, step: int, now_s: float,
                table: Mapping[NodeId, int]) -> bool:
        """May ``worker``, which just completed ``step`` steps at ``now_s``, start the next?"""
        if self._dssp is not None:
            return self._dssp.on_push(worker, step, now_s, FullView(table, exclude=worker)).advance
        return self.recheck(worker, step, table)

    def recheck(self, worker: NodeId, step: int, table: Mapping[NodeId, int]) -> bool:
        """Re-decide for a held (or joining) worker after the table changed."""
        policy = self.policy
        if isinstance(policy, ASP):
            return True
        if self._dssp is not None:
            return self._dssp.recheck(worker, step, FullView(table, exclude=worker)).advance
        if isinstance(policy, PSP):
            if policy.sample == 0:
                return True
            view = SampledView(table, policy.sample, self._rng, exclude=worker)
            return SSP(staleness=policy.staleness).decide(step, view).advance
        if isinstance(policy, SSP):
            return policy.decide(step, FullView(table, exclude=worker)).advance
        return as_decision(policy.decide(step, FullView(table, exclude=worker,
                                                        rng=self._rng))).advance

    def forget(self, worker: NodeId) -> None:
        """Drop a worker that left (DSSP's push history)."""
        if self._dssp is not None:
            self._dssp.forget(worker)

    def stalled(self, held: Mapping[NodeId, int], table: Mapping[NodeId, int],
                closed: bool) -> str | None:
        """Why nothing but a joining worker can move the job, when the barrier holds every
        worker in ``table`` (``held``: worker -> its step) and none is computing (no push
        is on its way to re-run the barrier), else None. The built-in policies (and so a
        follower shard's) always let the slowest worker go: only a custom barrier can.

        Raises:
            CallbackError: it does, and no worker can join (``closed``: a fixed
                ``workers=`` list). Before, the job waited out its timeout_s, which blamed
                the stop function, a push, pull or data=.
        """
        if not table or any(w not in held for w in table):
            return None
        fn = getattr(self.policy, "fn", None)
        name = (f"register_barrier's {getattr(fn, '__qualname__', fn)!s}" if fn is not None
                else f"{type(self.policy).__name__}.decide")
        at = ", ".join(f"{w} at step {held[w]}" for w in sorted(table))
        why = (f"the barrier holds every worker ({at}) and none is computing: nothing can "
               f"release them; {name} answered False for each of them")
        if closed:
            raise CallbackError(f"{why} (workers= is fixed, so no worker can join that it "
                                "might let go)")
        return why

    def granted(self, worker: NodeId) -> int:
        """DSSP's current extra staleness for ``worker`` (0 for other policies)."""
        return self._dssp.granted(worker) if self._dssp is not None else 0

"""A discrete-event harness that drives the real ServerCore with simulated workers on a
FakeClock (no sockets, no wall time)."""
from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np

from actorpy.clock import FakeClock
from actorpy.ids import NodeId
from engines.param.kinds import Join, Push, Status
from engines.param.server import Answer, Callbacks, ServerCore, ShardConfig
from engines.param.store import Store, plan_shards


def sgd_pull(lr: float = 0.1) -> Callable[[Store, dict[str, Any]], None]:
    def pull(store: Store, updates: dict[str, Any]) -> None:
        for key, update in updates.items():
            value, _ = store.get(key)
            store.set(key, value - lr * update)
    return pull


def make_core(policy: Any, workers: list[str], *, init: dict[str, Any] | None = None,
              stop: Any = None, schedule: Any = None, clock: FakeClock | None = None,
              pull: Any = None, **config: Any) -> ServerCore:
    init = {"w": np.zeros(2)} if init is None else init
    store = Store(init, plan_shards(init, 1), 0)
    return ServerCore(ShardConfig(policy=policy, expected=frozenset(NodeId(w) for w in workers),
                                  **config),
                      store, Callbacks(pull or sgd_pull(), schedule, stop), clock or FakeClock())


def go(actions: list) -> dict[str, int]:
    """worker -> step of each GO answer."""
    return {a.worker: a.reply.step for a in actions
            if isinstance(a, Answer) and a.reply.status == Status.GO}


class Sim:
    """n workers; each, when let go at step c, computes for a random time and pushes c + 1.

    Records, at every GO answer, how far the released worker is ahead of the slowest live
    worker in the server's own table (``lead``), and the largest spread of that table.
    """

    def __init__(self, policy: Any, n: int, seed: int, means: list[float] | None = None,
                 **config: Any) -> None:
        self.clock = FakeClock()
        self.rng = random.Random(seed)
        self.ids = [NodeId(f"w{i}") for i in range(n)]
        self.means = means or [1.0] * n
        self.core = make_core(policy, self.ids, clock=self.clock, seed=seed, **config)
        self.max_lead = 0
        self.max_spread = 0
        self.pushes = {w: 0 for w in self.ids}

    def run(self, until_s: float) -> Sim:
        for i, w in enumerate(self.ids):
            self.clock.call_later(0.01 * i, lambda w=w, i=i: self._deliver(
                self.core.join(Join(w, 0, i))))
        self.clock.run_until(until_s)
        return self

    def _deliver(self, actions: list) -> None:
        table = self.core.progress.steps
        for a in actions:
            if not isinstance(a, Answer) or a.reply.status != Status.GO:
                continue
            self.max_lead = max(self.max_lead, a.reply.step - min(table.values()))
            self.max_spread = max(self.max_spread, max(table.values()) - min(table.values()))
            w, step = a.worker, a.reply.step
            d = self.rng.expovariate(1.0 / self.means[self.ids.index(w)])
            self.clock.call_later(d, lambda w=w, step=step, d=d: self._push(w, step, d))

    def _push(self, w: NodeId, step: int, d: float) -> None:
        self.pushes[w] += 1
        self._deliver(self.core.push(w, Push(step + 1, {"w": np.ones(2)}, 1, d)))

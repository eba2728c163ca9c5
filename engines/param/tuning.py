"""Per-worker tuning at the barrier, fed the compute times workers report with each push:
LB-BSP batch sizes (Chen et al., SoCC 2020) and the straggler release policy (Hippo: a node
persistently slower than the rest is released and not taken back)."""
from __future__ import annotations

import statistics
from collections import deque
from typing import Iterable

from actorpy.barrier import LBBSPController
from actorpy.errors import ConfigError
from actorpy.ids import NodeId

#: LB-BSP never starves a worker completely (the controller's drop rule is for hopeless
#: nodes; here the straggler policy is the one that releases workers).
_NEVER_DROP = 1e12


class Balancer:
    """LB-BSP: each live worker's batch so that all finish a step together, keeping the
    global batch at ``batch`` times the number of workers.

    The plan is made again once every live worker has reported a step since the last one:
    each BSP round; under SSP, PSP and DSSP, where workers are released one at a time, about
    as often (a plan costs ~20 us: every release would add that to each step).

    The controller is rebuilt when workers join or leave, replaying the measurements kept
    here, so nothing learnt about the others is lost.
    """

    def __init__(self, batch: int, min_batch: int = 1, window: int = 6) -> None:
        if batch < 1 or min_batch < 1 or min_batch > batch:
            raise ConfigError(f"need 1 <= min_batch <= batch, got {min_batch} and {batch}")
        self.batch = batch
        self.min_batch = min_batch
        self._window = window
        self._history: dict[NodeId, deque[tuple[int, float]]] = {}
        self._controller: LBBSPController | None = None
        self._plan: dict[NodeId, int] = {}
        self._fresh: set[NodeId] = set()     # reported a step since the plan was made

    def set_workers(self, workers: Iterable[NodeId]) -> None:
        """The live workers changed: rebuild the controller over them."""
        live = sorted(workers)
        for gone in set(self._history) - set(live):
            del self._history[gone]
        for w in live:
            self._history.setdefault(w, deque(maxlen=self._window))
        self._controller = None
        self._plan, self._fresh = {}, set()
        if live:
            self._controller = LBBSPController(live, self.batch * len(live),
                                               min_batch=self.min_batch, window=self._window,
                                               drop_factor=_NEVER_DROP)
            for w in live:
                for b, t in self._history[w]:
                    self._controller.observe(w, b, t)

    def observe(self, worker: NodeId, batch: int, compute_s: float) -> None:
        """``worker`` took ``compute_s`` seconds for a step of ``batch`` samples."""
        if worker not in self._history or batch <= 0 or compute_s <= 0:
            return
        self._history[worker].append((batch, compute_s))
        self._fresh.add(worker)
        if self._controller is not None:
            self._controller.observe(worker, batch, compute_s)

    def batches(self) -> dict[NodeId, int]:
        """The next step's batch of every live worker."""
        if self._controller is not None and (not self._plan
                                             or self._fresh.issuperset(self._history)):
            self._plan = self._controller.batches()
            self._fresh.clear()
        return dict(self._plan)


class StragglerWatch:
    """Releases a worker whose time per sample stays above ``factor`` times the median of
    the others' for ``patience`` pushes in a row (means over the last ``window`` pushes).

    >>> watch = StragglerWatch(factor=2.0, patience=2, window=1)
    >>> for _ in range(2):
    ...     for w, t in (("a", 1.0), ("b", 1.1), ("c", 5.0)):
    ...         watch.observe(NodeId(w), 10, t)
    >>> [watch.is_straggler(NodeId(w)) for w in "abc"]
    [False, False, True]
    """

    def __init__(self, factor: float, patience: int = 5, window: int = 5) -> None:
        if not factor > 1.0 or patience < 1 or window < 1:
            raise ConfigError(f"straggler policy needs factor > 1, patience >= 1 and window "
                              f">= 1; got {factor}, {patience}, {window}")
        self.factor, self.patience = factor, patience
        self._window = window
        self._times: dict[NodeId, deque[float]] = {}
        self._strikes: dict[NodeId, int] = {}

    def observe(self, worker: NodeId, batch: int, compute_s: float) -> None:
        """Record a push; updates ``worker``'s count of consecutive slow pushes."""
        if batch <= 0 or compute_s < 0:
            return
        self._times.setdefault(worker, deque(maxlen=self._window)).append(compute_s / batch)
        mine = self._mean(worker)
        others = [self._mean(w) for w in self._times if w != worker]
        slow = (mine is not None and len(self._times[worker]) >= self._window and others
                and mine > self.factor * statistics.median(others))
        self._strikes[worker] = self._strikes.get(worker, 0) + 1 if slow else 0

    def is_straggler(self, worker: NodeId) -> bool:
        return self._strikes.get(worker, 0) >= self.patience

    def forget(self, worker: NodeId) -> None:
        self._times.pop(worker, None)
        self._strikes.pop(worker, None)

    def _mean(self, worker: NodeId) -> float | None:
        times = self._times.get(worker)
        return sum(times) / len(times) if times else None

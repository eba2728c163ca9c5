"""Discrete-event barrier simulator: P workers on a simulated clock, any policy.

Each worker loops: compute (a time from :mod:`~actorpy.barrier.workload`), push (its step
count goes up), ask the barrier. A blocked worker re-checks every time *some* worker
pushes, and PSP draws a fresh sample at each check (papers.md: "that choice matters for the
numbers"). Workers are ``NodeId("w00000")``, ``NodeId("w00001")``, ...

Two engines share the iteration times (so deterministic policies give identical steps):

* ``engine="reference"`` calls ``policy.decide`` (or the DSSP controller) with real
  :class:`FullView` s for every check of every blocked worker: exactly what a PS engine
  does, O(P) per check, for small P and as the oracle in tests;
* ``engine="fast"`` (default) is a heap-based event loop specialised to the rule
  ``c - min(view) <= s``: full-view policies wait in buckets keyed by the minimum they
  need; PSP's i.i.d. re-checks are folded into per-bucket cumulative hazards using
  :meth:`PSP.pass_probability` (exact in distribution); DSSP calls the very same
  :class:`DSSPController` with a two-entry view (the slowest and the fastest other, which
  is all its rule reads). 1000 workers x 1000 s run in seconds (see bench/barrier_sim.py).
"""
from __future__ import annotations

import heapq
import math
import os
import random
from dataclasses import dataclass, field

import numpy as np

from actorpy.barrier.dssp import DSSPController
from actorpy.barrier.fastsim import run_fast
from actorpy.barrier.policy import ASP, BSP, DSSP, PSP, SSP, Policy  # noqa: F401 (BSP: doctest)
from actorpy.barrier.view import FullView
from actorpy.barrier.workload import Durations, Workload
from actorpy.errors import ConfigError
from actorpy.ids import NodeId


@dataclass(frozen=True)
class SimConfig:
    """One simulated experiment (the barrier is passed separately).

    Attributes:
        workers: P >= 1.
        seconds: simulated seconds; steps completed by then are counted.
        workload: iteration-time model.
        seed: seeds every rng of the run (iteration times, samples).
    """

    workers: int = 200
    seconds: float = 200.0
    workload: Workload = field(default_factory=Workload)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if not (self.seconds > 0 and math.isfinite(self.seconds)):
            raise ConfigError(f"--seconds must be a finite number > 0, got {self.seconds}")
        if self.seed < 0:  # numpy seeds only with a non-negative int
            raise ConfigError(f"--seed must be an int >= 0, got {self.seed}")

    def node(self, index: int) -> NodeId:
        """The id of worker ``index`` (zero-padded, so ids sort like indices)."""
        return NodeId(f"w{index:0{max(5, len(str(self.workers - 1)))}d}")


@dataclass(frozen=True)
class SimResult:
    """Steps each worker completed within ``config.seconds``.

    >>> r = simulate(ASP(), SimConfig(workers=3, seconds=5, workload=Workload(dist="const")))
    >>> r.per_worker, r.total_updates, r.stats()["mean"]
    ((5, 5, 5), 15, 5.0)
    """

    barrier: str
    config: SimConfig
    per_worker: tuple[int, ...]
    engine: str = "fast"

    @property
    def total_updates(self) -> int:
        """Pushes the server would have received."""
        return sum(self.per_worker)

    def stats(self) -> dict[str, float]:
        """mean, std, min, max, p5, p50, p95 of per-worker steps."""
        arr = np.asarray(self.per_worker, dtype=float)
        p5, p50, p95 = np.percentile(arr, [5, 50, 95])
        return {"mean": float(arr.mean()), "std": float(arr.std()), "min": float(arr.min()),
                "max": float(arr.max()), "p5": float(p5), "p50": float(p50), "p95": float(p95)}

    def to_json(self) -> dict:
        """The ``actorpy sim --json`` object."""
        w = self.config.workload
        config = {"workers": self.config.workers, "seconds": self.config.seconds,
                  "seed": self.config.seed, "dist": w.dist, "mean": w.mean_s,
                  "shape": w.shape, "straggler_frac": w.straggler_frac,
                  "straggler_slowdown": w.straggler_slowdown,
                  "transient_prob": w.transient_prob,
                  "transient_slowdown": w.transient_slowdown, "engine": self.engine}
        return {"barrier": self.barrier, "config": config, "steps": self.stats(),
                "per_worker": list(self.per_worker), "total_updates": self.total_updates}


def durations_for(config: SimConfig) -> Durations:
    """The iteration-time matrix of a run (seeded by ``config.seed``)."""
    w = config.workload
    fastest = w.mean_s
    guess = int(config.seconds / fastest * 1.25 + 6 * math.sqrt(config.seconds / fastest) + 16)
    # each drawn time is a float64 and a Python float (its list): ~40 bytes; past memory,
    # numpy failed with "Maximum allowed dimension exceeded" (a traceback) or MemoryError
    need = 40 * guess * config.workers
    if need > os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"):
        raise ConfigError(f"{config.workers} workers for {config.seconds:g} s at {fastest:g} s "
                          f"an iteration draw about {guess:.3g} iteration times each "
                          f"({need / 2**30:.3g} GiB), more than this machine's memory; lower "
                          "--seconds or --workers, or raise --mean")
    return Durations(w, config.workers, guess, np.random.default_rng(config.seed))


def _asp_closed_form(config: SimConfig, durations: Durations) -> list[int]:
    """ASP never waits: worker w completes #{k : t_w0 + ... + t_wk <= T} steps."""
    while True:
        ends = np.cumsum(durations.array, axis=1)
        if (ends[:, -1] > config.seconds).all():
            break
        durations.grow()
    return (ends <= config.seconds).sum(axis=1).tolist()


def _reference(policy: Policy, config: SimConfig, durations: Durations) -> list[int]:
    """Every check calls the policy with a real FullView (O(P) per check)."""
    nodes = [config.node(i) for i in range(config.workers)]
    table = {n: 0 for n in nodes}
    rng = random.Random(config.seed)
    controller = DSSPController(policy) if isinstance(policy, DSSP) else None
    heap = [(durations.at(i, 0), i) for i in range(config.workers)]
    heapq.heapify(heap)
    blocked: list[int] = []
    while heap and heap[0][0] <= config.seconds:
        now, w = heapq.heappop(heap)
        table[nodes[w]] += 1
        view = FullView(table, exclude=nodes[w], rng=rng)
        if controller is not None:
            ok = controller.on_push(nodes[w], table[nodes[w]], now, view).advance
        else:
            ok = policy.decide(table[nodes[w]], view).advance
        still = []
        for b in blocked:  # every blocked worker re-checks, with a fresh sample
            view_b = FullView(table, exclude=nodes[b], rng=rng)
            if controller is not None:
                ok_b = controller.recheck(nodes[b], table[nodes[b]], view_b).advance
            else:
                ok_b = policy.decide(table[nodes[b]], view_b).advance
            if ok_b:
                heapq.heappush(heap, (now + durations.at(b, table[nodes[b]]), b))
            else:
                still.append(b)
        blocked = still
        if ok:
            heapq.heappush(heap, (now + durations.at(w, table[nodes[w]]), w))
        else:
            blocked.append(w)
    return [table[n] for n in nodes]


def simulate(policy: Policy, config: SimConfig, engine: str = "fast") -> SimResult:
    """Run ``policy`` on ``config`` and return every worker's completed steps.

    Args:
        policy: BSP(), SSP(s), ASP(), PSP(β, s) or DSSP(low, high).
        config: workers, seconds, workload, seed.
        engine: "fast" (default) or "reference" (policy.decide on every check; small P).

    >>> cfg = SimConfig(workers=50, seconds=50, seed=1)
    >>> bsp = simulate(BSP(), cfg).per_worker
    >>> max(bsp) - min(bsp) <= 1
    True
    """
    if engine not in ("fast", "reference"):
        raise ConfigError(f"engine must be 'fast' or 'reference', got {engine!r}")
    if not isinstance(policy, (SSP, ASP, PSP, DSSP)):
        raise ConfigError(f"the simulator runs BSP, SSP, ASP, PSP and DSSP, not {policy!r}")
    durations = durations_for(config)
    if engine == "reference":
        steps = _reference(policy, config, durations)
    elif isinstance(policy, ASP) or (isinstance(policy, PSP) and policy.sample == 0):
        steps = _asp_closed_form(config, durations)
    else:
        controller = DSSPController(policy) if isinstance(policy, DSSP) else None
        steps = run_fast(policy, controller, config, durations)
    return SimResult(repr(policy), config, tuple(steps), engine)


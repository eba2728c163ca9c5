"""The simulator's fast engine: a heap event loop specialised to ``c - min(view) <= s``.

Full views (BSP, SSP, DSSP, PSP with β >= P-1): a worker that cannot go on needs the minimum
step to reach ``need = c - bound``; it waits in the bucket for that ``need`` and every waiter
of a bucket starts at the push that lifts the minimum to it (the moment a reference engine,
re-checking everyone at every push, would let it go).

Sampled views (PSP, 0 < β < P-1): each check of a worker needing ``n`` passes independently
with ``p_n = PSP.pass_probability(L_n, P-1)``, ``L_n`` = workers with fewer than ``n`` steps,
and every push is one check for everyone blocked. Surviving checks has probability
``exp(-Σ h)`` with hazard ``h = -log(1 - p)``, so a blocker draws a threshold ``E ~ Exp(1)``
and is released at the first push where its bucket's cumulative hazard exceeds it. ``L_n``
changes only when a worker moves from ``n-1`` to ``n``: one bucket per push, so the loop
costs O(log P) per push instead of one sample per blocked worker per push.
"""
from __future__ import annotations

import heapq
import math
import random
from typing import TYPE_CHECKING

import numpy as np

from actorpy.barrier.dssp import DSSPController
from actorpy.barrier.policy import DSSP, PSP, SSP, Policy
from actorpy.barrier.view import FullView
from actorpy.barrier.workload import Durations

if TYPE_CHECKING:
    from actorpy.barrier.sim import SimConfig


def run_fast(policy: Policy, controller: DSSPController | None, config: SimConfig,
             durations: Durations) -> list[int]:
    """Steps completed by each worker within ``config.seconds`` (see module docstring)."""
    workers = config.workers
    if isinstance(policy, PSP) and 0 < policy.sample < workers - 1:
        return _sampled(policy, config, durations)
    return _full(policy, controller, config, durations)


class _Loop:
    """State shared by both loops: steps, step histogram, minimum, completion heap."""

    def __init__(self, config: SimConfig, durations: Durations) -> None:
        self.seconds = config.seconds
        self.durations = durations
        self.rows = durations.rows
        self.ncols = len(self.rows[0])
        self.steps = [0] * config.workers
        self.counts = [config.workers, 0]
        self.minstep = 0
        self.heap = [(self.rows[i][0], i) for i in range(config.workers)]
        heapq.heapify(self.heap)

    def start(self, worker: int, now: float) -> None:
        k = self.steps[worker]
        if k >= self.ncols:
            self.durations.grow()
            self.rows, self.ncols = self.durations.rows, len(self.durations.rows[0])
        heapq.heappush(self.heap, (now + self.rows[worker][k], worker))

    def push(self) -> tuple[float, int, int] | None:
        """Pop the next completion within the horizon and count it: (now, worker, old step)."""
        if not self.heap or self.heap[0][0] > self.seconds:
            return None
        now, w = heapq.heappop(self.heap)
        x = self.steps[w]
        self.steps[w] = x + 1
        counts = self.counts
        counts[x] -= 1
        if x + 1 == len(counts):
            counts.append(0)
        counts[x + 1] += 1
        if x == self.minstep and counts[x] == 0:
            self.minstep += 1
        return now, w, x


def _full(policy: Policy, controller: DSSPController | None, config: SimConfig,
          durations: Durations) -> list[int]:
    loop = _Loop(config, durations)
    waiting: dict[int, list[int]] = {}
    dssp = controller is not None and isinstance(policy, DSSP)
    never_waits = not isinstance(policy, (SSP, PSP, DSSP)) or (
        isinstance(policy, PSP) and policy.sample == 0)  # ASP, or PSP with beta = 0
    staleness = math.inf if never_waits else getattr(policy, "staleness", 0)
    nodes = [config.node(i) for i in range(config.workers)] if dssp else []
    mirror = np.zeros(config.workers, dtype=np.int64) if dssp else None
    while (event := loop.push()) is not None:
        now, w, x = event
        c = x + 1
        released = waiting.pop(loop.minstep, None)  # only present right after the min rose
        if released:
            for b in released:
                loop.start(b, now)
        if dssp:
            mirror[w] = c
            decision = controller.on_push(nodes[w], c, now, _summary(mirror, w, nodes))
            need = c - policy.low - controller.granted(nodes[w])
            advance = decision.advance
        else:
            need = c - staleness
            advance = loop.minstep >= need
        if advance:
            loop.start(w, now)
        else:
            waiting.setdefault(need, []).append(w)
    return loop.steps


def _summary(mirror: np.ndarray, me: int, nodes: list) -> FullView:
    """The slowest other (lowest index among ties) and the fastest other: all DSSP reads."""
    if len(mirror) == 1:
        return FullView({})
    mine = mirror[me]
    mirror[me] = np.iinfo(np.int64).max
    slow = int(np.argmin(mirror))
    mirror[me] = -1
    fast = int(np.argmax(mirror))
    mirror[me] = mine
    return FullView({nodes[slow]: int(mirror[slow]), nodes[fast]: int(mirror[fast])})


class _Bucket:
    """Blocked PSP workers that need the same minimum step ``n``."""

    __slots__ = ("hazard_sum", "k_base", "rate", "lagging", "heap", "version")

    def __init__(self, k: int, lagging: int, rate: float) -> None:
        self.hazard_sum = 0.0   # cumulative hazard of the checks up to push number k_base
        self.k_base = k
        self.rate = rate        # hazard of one check, -log(1 - p)
        self.lagging = lagging  # L_n
        self.heap: list[tuple[float, int]] = []
        self.version = 0

    def fold(self, k: int) -> None:
        if k > self.k_base:
            self.hazard_sum = (math.inf if self.rate == math.inf
                               else self.hazard_sum + (k - self.k_base) * self.rate)
            self.k_base = k

    def release_at(self) -> float:
        """Push number at which the first threshold is crossed (inf if never)."""
        if self.rate == math.inf:
            return self.k_base + 1
        if self.rate <= 0.0:
            return math.inf
        gap = (self.heap[0][0] - self.hazard_sum) / self.rate
        return self.k_base + max(1, math.ceil(gap))


def _sampled(policy: PSP, config: SimConfig, durations: Durations) -> list[int]:
    loop = _Loop(config, durations)
    rng = random.Random(config.seed)
    population = config.workers - 1
    cache: dict[int, tuple[float, float]] = {}

    def chance(lagging: int) -> tuple[float, float]:
        if lagging not in cache:
            p = policy.pass_probability(lagging, population)
            cache[lagging] = (p, math.inf if p >= 1.0 else -math.log1p(-p))
        return cache[lagging]

    buckets: dict[int, _Bucket] = {}
    releases: list[tuple[float, int, int]] = []

    def reschedule(n: int, bucket: _Bucket) -> None:
        bucket.version += 1
        k = bucket.release_at()
        if k != math.inf:
            heapq.heappush(releases, (k, n, bucket.version))

    k = 0
    while (event := loop.push()) is not None:
        now, w, x = event
        k += 1
        moved = buckets.get(x + 1)
        if moved is not None:  # one fewer worker below x + 1: those checks get easier
            moved.fold(k - 1)
            moved.lagging -= 1
            moved.rate = chance(moved.lagging)[1]
            reschedule(x + 1, moved)
        while releases and releases[0][0] <= k:  # push k is a re-check for every blocker
            _, n, version = heapq.heappop(releases)
            bucket = buckets.get(n)
            if bucket is None or bucket.version != version:
                continue
            bucket.fold(k)
            while bucket.heap and bucket.heap[0][0] <= bucket.hazard_sum:
                loop.start(heapq.heappop(bucket.heap)[1], now)
            if bucket.heap:
                reschedule(n, bucket)
            else:
                del buckets[n]
        need = x + 1 - policy.staleness  # the pusher's own check, with a fresh sample
        lagging = sum(loop.counts[loop.minstep:need]) if need > loop.minstep else 0
        p, rate = chance(lagging)
        if lagging == 0 or rng.random() < p:
            loop.start(w, now)
            continue
        bucket = buckets.get(need)
        if bucket is None:
            bucket = buckets[need] = _Bucket(k, lagging, rate)
        bucket.fold(k)
        threshold = bucket.hazard_sum + rng.expovariate(1.0)
        first = not bucket.heap or threshold < bucket.heap[0][0]
        heapq.heappush(bucket.heap, (threshold, w))
        if first:
            reschedule(need, bucket)
    return loop.steps

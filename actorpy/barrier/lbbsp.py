"""LB-BSP: load balancing at the barrier by resizing batches (Chen et al., SoCC 2020).

Instead of relaxing BSP, give each worker a batch it can finish in the same time as the
others. The controller is plain arithmetic fed measurements ``(batch, seconds)``; it keeps
no clock. It needs no prior knowledge of the time curve: each worker's curve is modelled by
a monotone piecewise-linear fit through its recent measurements (proportional through the
origin while it has one point), which is exact for CPU-like ``t = c * b`` after one
iteration and homes in on GPU-like curves (flat then linear) like a secant method as points
accumulate. Measurements are noisy (on a shared machine one iteration in ten may take
several times the usual): each point is a median, a measurement far off the fit counts
only when several in a row agree or most recent ones are off (the worker's speed changed;
the older points are then dropped, so it re-converges in a few iterations), and a balanced
plan is kept until a new one is predicted to be ``min_gain`` faster. Updates are then combined with
:func:`weighted_average` so that every sample counts equally, as one full-batch step would.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Mapping, Sequence, TypeVar

from actorpy.errors import ConfigError
from actorpy.ids import NodeId

T = TypeVar("T")

#: A measurement within this fraction of a measured batch counts towards that point (scaled
#: in proportion): points closer than that would give noise for slopes.
_MERGE = 0.05


class TimeCurve:
    """A worker's measured iteration time as a function of its batch (monotone fit).

    Each batch measured is a point whose time is the median of its last ``samples``
    measurements, so a worker kept at one batch gets a steadier estimate the longer it
    stays there, and one preempted iteration (ten times the usual, on a loaded machine)
    moves nothing. A point not measured again within the last ``window`` measurements is
    dropped, but for the two measured last: a wrong one (a preempted first measurement)
    cannot pin the fit for good, and the fit keeps a slope (one point alone would be
    extrapolated through the origin, which for a small batch with a fixed cost, such as a
    message's trip, predicts far too much for a larger one). A measurement that contradicts the
    fit by more than the tolerance is held back as a suspect. The worker's speed changed
    when ``confirm`` suspects in a row agree (same side, similar ratios), or when the
    median ratio of the last ``2 * confirm - 1`` measurements to the fit is off by more
    than twice the tolerance (slower most of the time, by varying amounts: a loaded
    machine); then the older points are dropped and those measurements become the curve.

    The fit is rebuilt when a point changes, not at every query: a balance asks each
    curve many times between two measurements."""

    def __init__(self, window: int, samples: int = 5, confirm: int = 3) -> None:
        self._window = window
        self._samples = samples
        self._confirm = confirm
        self._points: dict[int, deque[float]] = {}   # batch -> recent times, oldest first
        self._seen: dict[int, int] = {}               # batch -> when it was last measured
        self._count = 0                               # measurements stored
        self._suspects: list[tuple[int, float, float]] = []   # batch, time, time / fit
        self._recent: deque[tuple[int, float, float]] = deque(maxlen=2 * confirm - 1)
        self._fitted: list[tuple[float, float]] = []
        self._tail = 0.0
        self._best_rate = math.inf   # the least seconds per sample ever measured

    def add(self, batch: int, time_s: float, change_tolerance: float) -> None:
        """Add a measurement (see the class docstring for suspects and speed changes)."""
        self._best_rate = min(self._best_rate, time_s / batch)
        if self._fitted:
            expected = self.time_at(batch)
            ratio = time_s / expected if expected > 0 else 1.0
            self._recent.append((batch, time_s, ratio))
            if abs(ratio - 1.0) > change_tolerance:
                self._suspects.append((batch, time_s, ratio))
                while not _agree([r for _, _, r in self._suspects], change_tolerance):
                    del self._suspects[0]   # noise (a preempted iteration), not a change
                if len(self._suspects) >= self._confirm:
                    self._restart(self._suspects)
                elif _far(statistics.median(r for _, _, r in self._recent), change_tolerance):
                    self._restart(self._recent)   # slower (or faster) most of the time
                self._refit()
                return
            self._suspects.clear()
        self._store(batch, time_s)
        self._refit()

    def _refit(self) -> None:
        """Rebuild the fit and its tail. Where the tail is a time per sample (no slope to
        go by), it is at most the least one the worker ever measured: with a fixed cost
        per iteration (t = a + c * b) time per sample falls as the batch grows, and a tail
        priced from the smallest batches alone ((a + c) per sample at a batch of one) puts
        a larger batch at many times its cost; the worker, never given one again, stays at
        its smallest batch for good. That happens after a load spike: the worker's batch
        shrinks, its speed "changes" and the curve restarts from small batches (traced on
        Job A: the 3x straggler 440 rounds at 1 sample of 512). A tail that is too low
        corrects itself: the worker gets a larger batch and is measured there. It is not
        reset at a speed change, so it may be too low for a worker that got slower: one
        extra round or so to re-converge on a GPU-like curve."""
        self._fitted = self._fit()
        self._tail = self._tail_slope(self._fitted) if self._fitted else 0.0

    def _restart(self, measurements: Sequence[tuple[int, float, float]]) -> None:
        """The worker's speed changed: ``measurements`` replace the curve."""
        kept = list(measurements)
        self._points.clear()
        self._seen.clear()
        self._suspects.clear()
        self._recent.clear()
        for b, t, _ in kept:
            self._store(b, t)

    def _store(self, batch: int, time_s: float) -> None:
        near = min(self._points, key=lambda b: abs(b - batch), default=None)
        if near is not None and abs(near - batch) <= _MERGE * near:   # the same point
            time_s *= near / batch
            batch = near
        times = self._points.pop(batch, None) or deque(maxlen=self._samples)
        times.append(time_s)
        self._points[batch] = times            # the most recently measured batch goes last
        self._count += 1
        self._seen[batch] = self._count
        stale = [b for b in self._points if self._count - self._seen[b] >= self._window]
        for old in stale[:len(self._points) - 2]:   # the two latest points stay: a shape
            del self._points[old], self._seen[old]

    def _fit(self) -> list[tuple[float, float]]:
        pts = sorted((float(b), statistics.median(ts))
                     for b, ts in self._points.items() if b > 0)
        fitted: list[tuple[float, float]] = []
        for b, t in pts:  # enforce monotone time (measurements are noisy)
            fitted.append((b, max(t, fitted[-1][1]) if fitted else t))
        return fitted

    def is_known(self) -> bool:
        """True once at least one non-empty batch was measured."""
        return bool(self._fitted)

    def knots(self) -> list[float]:
        """The times where ``batch_for`` changes slope (the fitted points' times)."""
        return [t for _, t in self._fitted]

    def _tail_slope(self, pts: list[tuple[float, float]]) -> float:
        """The slope beyond the largest batch: the last two points' when they have one,
        else their time per sample, but never more than the least time per sample ever
        measured (``_refit``)."""
        b1, t1 = pts[-1]
        rate = t1 / b1
        if len(pts) >= 2:
            b0, t0 = pts[-2]
            slope = (t1 - t0) / (b1 - b0)
            if slope >= 0.25 * rate:  # a near-flat tail would promise unbounded batches
                return slope
        return min(rate, self._best_rate)

    def time_at(self, batch: float) -> float:
        """Predicted seconds for ``batch`` samples."""
        pts = self._fitted
        b0, t0 = pts[0]
        if batch <= b0:
            return t0 * batch / b0
        for (bl, tl), (br, tr) in zip(pts, pts[1:]):
            if batch <= br:
                return tl + (tr - tl) * (batch - bl) / (br - bl)
        bl, tl = pts[-1]
        return tl + self._tail * (batch - bl)

    def batch_for(self, time_s: float) -> float:
        """The largest (fractional) batch predicted to finish within ``time_s``."""
        pts = self._fitted
        b0, t0 = pts[0]
        if time_s <= t0:
            return b0 * time_s / t0 if t0 > 0 else b0
        best = b0
        for (bl, tl), (br, tr) in zip(pts, pts[1:]):
            if time_s >= tr:
                best = br
            elif tr > tl:
                return bl + (br - bl) * (time_s - tl) / (tr - tl)
        bl, tl = pts[-1]
        if best < bl:
            return best
        return bl + (time_s - tl) / self._tail


def _agree(ratios: list[float], tolerance: float) -> bool:
    """Whether measured/predicted ratios tell the same speed change: all on one side of 1,
    within a factor ``1 + tolerance`` of each other (a worker slowed down 3x measures
    3x every time; preempted iterations measure 3x, then 12x, then 1x)."""
    return (len({r > 1.0 for r in ratios}) <= 1
            and max(ratios) <= (1.0 + tolerance) * min(ratios))


def _far(ratio: float, tolerance: float) -> bool:
    """Whether the median ratio of the recent measurements to the fit says the speed
    changed even though they do not agree with each other (a loaded machine: slower most
    of the time, by varying amounts): off by more than twice the tolerance."""
    return ratio > 1.0 + 2.0 * tolerance or ratio < 1.0 / (1.0 + 2.0 * tolerance)


def _with_floor(shares: Mapping[NodeId, float], total: int, floor: int) -> dict[NodeId, float]:
    """``shares`` scaled to ``total``, none under ``floor``: those below get ``floor`` and
    the others share the rest in proportion (before, the floor was applied before scaling
    down, and a worker got less than ``min_batch``: 15 of a floor of 16).

    >>> _with_floor({"a": 1.0, "b": 19.0}, 64, 16)
    {'a': 16.0, 'b': 48.0}
    """
    fixed: list[NodeId] = []
    free = dict(shares)
    while free:
        rest = total - floor * len(fixed)
        weight = sum(free.values())
        scaled = {n: v * rest / weight if weight > 0 else rest / len(free)
                  for n, v in free.items()}
        low = [n for n, v in scaled.items() if v < floor]
        if not low:
            return {**{n: float(floor) for n in fixed}, **scaled}
        fixed.extend(low)
        for n in low:
            del free[n]
    return {n: total / len(fixed) for n in fixed}   # every share at the floor: even


def _round_to_total(shares: Mapping[NodeId, float], total: int) -> dict[NodeId, int]:
    """Integers summing to ``total``, by largest remainder (ties by node id)."""
    floors = {n: int(math.floor(v)) for n, v in shares.items()}
    short = total - sum(floors.values())
    order = sorted(shares, key=lambda n: (floors[n] - shares[n], n))
    for n in order[:max(short, 0)]:
        floors[n] += 1
    return floors


class LBBSPController:
    """Per-worker batch sizes that equalise iteration times for a fixed global batch.

    Args:
        workers: the workers sharing ``global_batch``.
        global_batch: samples per iteration, in total (kept exactly).
        min_batch: the least a working worker is given.
        window: a point of a worker's curve not measured again within its last ``window``
            measurements is dropped.
        drop_factor: a worker gets 0 only if even ``min_batch`` is predicted to take more
            than ``drop_factor`` times the balanced time of the others (hopeless).
        change_tolerance: relative misprediction that makes a measurement a suspect (see
            ``TimeCurve`` for when suspects mean a speed change).
        samples: measurements per batch whose median is that point's time.
        confirm: agreeing suspects in a row that signal a speed change.
        min_gain: the batches change only when the new ones are predicted to shorten the
            iteration by at least this fraction; otherwise the last ones are kept (a
            balanced plan is not reshuffled by noise, and a worker that keeps its batch
            refines that point's median).

    >>> lb = LBBSPController([NodeId("a"), NodeId("b")], global_batch=120)
    >>> lb.batches()
    {'a': 60, 'b': 60}
    >>> lb.observe(NodeId("a"), 60, 1.0); lb.observe(NodeId("b"), 60, 3.0)  # b 3x slower
    >>> lb.batches()
    {'a': 90, 'b': 30}
    """

    def __init__(self, workers: Sequence[NodeId], global_batch: int, *, min_batch: int = 1,
                 window: int = 6, drop_factor: float = 2.0,
                 change_tolerance: float = 0.25, samples: int = 5, confirm: int = 3,
                 min_gain: float = 0.01) -> None:
        if not workers:
            raise ConfigError("LBBSPController needs at least one worker")
        if global_batch < len(workers) * min_batch or min_batch < 1:
            raise ConfigError(f"global_batch={global_batch} cannot give {len(workers)} "
                              f"workers min_batch={min_batch} each")
        if drop_factor < 1.0 or window < 2 or samples < 1 or confirm < 1:
            raise ConfigError("drop_factor must be >= 1, window >= 2, samples and confirm >= 1")
        if not 0.0 <= min_gain < 1.0:
            raise ConfigError(f"min_gain must be in [0, 1), got {min_gain}")
        self.global_batch = global_batch
        self.min_batch = min_batch
        self._drop_factor = drop_factor
        self._tolerance = change_tolerance
        self._min_gain = min_gain
        self._curves = {w: TimeCurve(window, samples, confirm) for w in workers}
        self._last: dict[NodeId, int] | None = None

    def observe(self, node: NodeId, batch: int, time_s: float) -> None:
        """Record that ``node`` took ``time_s`` seconds for an iteration of ``batch``."""
        if node not in self._curves:
            raise ConfigError(f"unknown worker {node!r}")
        if batch > 0 and time_s > 0:
            self._curves[node].add(batch, time_s, self._tolerance)

    def predict_time(self, node: NodeId, batch: int) -> float | None:
        """Predicted seconds for ``node`` to process ``batch`` (None before a measurement)."""
        curve = self._curves[node]
        return curve.time_at(batch) if curve.is_known() else None

    def _balance(self, nodes: list[NodeId]) -> tuple[float, dict[NodeId, float]]:
        """The least common iteration time T at which the workers' batches add up to the
        global batch, and those batches.

        Each ``batch_for`` is piecewise linear in the time, with knots at its curve's
        fitted times, so their sum S is too (non-decreasing; at a knot it may jump). A
        binary search over the knots finds the piece where S reaches the global batch, and
        T is solved on that piece exactly, from two points inside it (a knot's own value
        may be either side of a jump): O(n log n) curve evaluations instead of a
        bisection's 100 n, and the same T."""
        curves = [self._curves[n] for n in nodes]
        goal = self.global_batch

        def total(t: float) -> float:
            return sum(c.batch_for(t) for c in curves)

        end = max(c.time_at(goal) for c in curves)   # S(end) >= goal: one curve alone
        knots = sorted({t for c in curves for t in c.knots() if 0.0 < t < end})
        knots.append(end)
        lo, hi = 0, len(knots) - 1     # the first knot where S reaches goal (else end)
        while lo < hi:
            mid = (lo + hi) // 2
            if total(knots[mid]) >= goal:
                hi = mid
            else:
                lo = mid + 1
        right = knots[lo]
        left = knots[lo - 1] if lo > 0 else 0.0
        t1, t2 = left + (right - left) / 3, left + 2 * (right - left) / 3
        if t2 > t1:   # S is linear on the open piece (left, right), if it has width
            s1, s2 = total(t1), total(t2)
            slope = (s2 - s1) / (t2 - t1)
            from_left = s1 - slope * (t1 - left)   # S just after left
            if from_left >= goal:
                right = left
            elif slope > 0 and from_left + slope * (right - left) >= goal:
                right = min(right, left + (goal - from_left) / slope)
        for _ in range(64):   # where S(T) >= goal exactly (at a jump, or after rounding)
            if right >= end or total(right) >= goal:
                break
            right = math.nextafter(right, math.inf)
        return right, {n: c.batch_for(right) for n, c in zip(nodes, curves)}

    def batches(self) -> dict[NodeId, int]:
        """Next iteration's batch per worker; sums to ``global_batch``.

        Workers not measured yet share the batch equally with the others' average. Once
        all are measured, the last batches are kept unless the balanced ones are predicted
        to be at least ``min_gain`` faster.
        """
        nodes = list(self._curves)
        known = [n for n in nodes if self._curves[n].is_known()]
        if len(known) < len(nodes):
            self._last = _round_to_total({n: self.global_batch / len(nodes) for n in nodes},
                                         self.global_batch)
            return dict(self._last)
        active = known
        while True:
            target, shares = self._balance(active)
            hopeless = [n for n in active if len(active) > 1 and
                        self._curves[n].time_at(self.min_batch) > self._drop_factor * target]
            if not hopeless:
                break
            active = [n for n in active if n not in hopeless]
        result = _round_to_total(_with_floor({n: shares[n] for n in active},
                                             self.global_batch, self.min_batch),
                                 self.global_batch)
        plan = {n: result.get(n, 0) for n in nodes}
        last = self._last
        if last is not None and last.keys() == plan.keys() and \
                self._predicted(plan) > (1.0 - self._min_gain) * self._predicted(last):
            return dict(last)
        self._last = plan
        return dict(plan)

    def _predicted(self, plan: Mapping[NodeId, int]) -> float:
        """The predicted iteration time of ``plan`` (its slowest worker)."""
        return max((self._curves[n].time_at(b) for n, b in plan.items() if b > 0), default=0.0)


def weighted_average(updates: Sequence[T], batch_sizes: Sequence[int]) -> T:
    """Combine per-worker mean gradients weighted by batch size: ``Σ b_i g_i / Σ b_i``.

    Every sample counts equally, so the result equals the mean over the union of batches.
    Works for numpy arrays, torch tensors and floats.

    >>> weighted_average([1.0, 4.0], [3, 1])
    1.75
    """
    if len(updates) != len(batch_sizes):
        raise ConfigError(f"{len(updates)} updates but {len(batch_sizes)} batch sizes")
    pairs = [(u, b) for u, b in zip(updates, batch_sizes) if b > 0]
    total = sum(b for _, b in pairs)
    if total <= 0:
        raise ConfigError("weighted_average needs at least one positive batch size")
    acc = pairs[0][0] * (pairs[0][1] / total)
    for u, b in pairs[1:]:
        acc = acc + u * (b / total)
    return acc

"""LB-BSP batch balancing, driven by simulated (batch, seconds) measurements."""
from __future__ import annotations

import math

import numpy as np
import pytest

from actorpy.barrier import LBBSPController, weighted_average
from actorpy.errors import ConfigError
from actorpy.ids import NodeId

WORKERS = [NodeId(f"w{i}") for i in range(4)]
GLOBAL = 512


def linear(speed):  # CPU-like: time proportional to batch
    return lambda b: b / speed


def saturating(slowdown, t0=0.05, k=0.004, knee=64.0):  # GPU-like: flat, then linear
    return lambda b: slowdown * (t0 + k * (math.sqrt(b * b + knee * knee) - knee))


def ideal_time(curves, total):
    lo, hi = 0.0, max(c(total) for c in curves)
    for _ in range(200):
        mid = (lo + hi) / 2
        fits = 0.0
        for c in curves:  # the largest batch each worker can do within mid
            if c(0) > mid:
                continue
            blo, bhi = 0.0, float(total)
            for _ in range(60):
                bm = (blo + bhi) / 2
                blo, bhi = (bm, bhi) if c(bm) <= mid else (blo, bm)
            fits += blo
        lo, hi = (mid, hi) if fits < total else (lo, mid)
    return hi


def run(controller, curves, iterations, rng, noise=0.02):
    """Drive the controller; return the iteration time (the slowest worker) each round."""
    times = []
    for _ in range(iterations):
        batches = controller.batches()
        assert sum(batches.values()) == controller.global_batch
        took = {}
        for w, curve in zip(WORKERS, curves):
            if batches[w] > 0:
                took[w] = curve(batches[w]) * (1 + noise * rng.uniform(-1, 1))
                controller.observe(w, batches[w], took[w])
        times.append(max(took.values()))
    return times


@pytest.mark.parametrize("kind", ["linear", "saturating"])
def test_one_3x_slower_worker_balances_within_15_percent_in_10_iterations(kind):
    if kind == "linear":
        curves = [linear(100.0)] * 3 + [linear(100.0 / 3)]
        ideal = GLOBAL / (3 * 100.0 + 100.0 / 3)  # total work / total speed
    else:
        curves = [saturating(1.0)] * 3 + [saturating(3.0)]
        ideal = ideal_time(curves, GLOBAL)
    times = run(LBBSPController(WORKERS, GLOBAL), curves, 10, np.random.default_rng(0))
    unbalanced = max(c(GLOBAL / 4) for c in curves)
    assert times[0] == pytest.approx(unbalanced, rel=0.03)  # first round: equal split
    assert times[-1] <= 1.15 * ideal
    assert times[-1] < 0.8 * unbalanced


@pytest.mark.parametrize("kind", ["linear", "saturating"])
def test_reconverges_within_a_few_iterations_after_a_speed_change(kind):
    make = (lambda f: linear(100.0 / f)) if kind == "linear" else saturating
    lb = LBBSPController(WORKERS, GLOBAL)
    rng = np.random.default_rng(1)
    run(lb, [make(1.0)] * 3 + [make(3.0)], 10, rng)
    changed = [make(1.0), make(4.0), make(1.0), make(1.0)]  # w1 slows down, w3 recovers
    # 7 rounds: over seeds 0-39 the saturating case is within 15 % from round 5-7 on (5 was
    # this seed's luck: 1 seed in 40), linear from round 4
    times = run(lb, changed, 7, rng)
    assert times[-1] <= 1.15 * ideal_time(changed, GLOBAL)


def test_drops_only_a_hopeless_worker():
    curves = [linear(100.0)] * 3 + [lambda b: 50.0 + b]  # w3: 50 s even for one sample
    lb = LBBSPController(WORKERS, GLOBAL)
    run(lb, curves, 6, np.random.default_rng(2))   # 1 + confirm (3) + 2 to learn its 50 s
    batches = lb.batches()
    assert batches[WORKERS[3]] == 0 and sum(batches.values()) == GLOBAL
    slow_but_useful = [linear(100.0)] * 3 + [linear(10.0)]  # 10x slower, still worth a share
    lb = LBBSPController(WORKERS, GLOBAL)
    run(lb, slow_but_useful, 3, np.random.default_rng(2))
    assert 0 < lb.batches()[WORKERS[3]] < GLOBAL / 10


def affine(fixed_us, us_per_sample, slowdown=1.0, extra_us=0.0):
    """A CPU step with a fixed cost; a straggler ``slowdown`` times slower, plus a fixed
    ``extra_us`` (Job A's slow worker sleeps twice its compute and wakes up late)."""
    return lambda b: 1e-6 * (slowdown * (fixed_us + us_per_sample * b) + extra_us)


def noisy_run(controller, curves, iterations, rng, preempted=0.05):
    """Like ``run`` on a loaded machine: 10 % noise, one tail, and ``preempted`` of the
    iterations 3-20x slower (measured on a shared 2-core machine: 3-15 % of Job A's steps
    took over twice the median, almost all one at a time). Returns each round's cost by
    the noise-free curves and each round's batches."""
    costs, plans = [], []
    workers = list(controller.batches())
    for _ in range(iterations):
        batches = controller.batches()
        plans.append(dict(batches))
        for w, curve in zip(workers, curves):
            took = curve(batches[w]) * (1 + 0.1 * rng.standard_normal() ** 2)
            if rng.random() < preempted:
                took *= rng.uniform(3, 20)
            controller.observe(w, batches[w], took)
        costs.append(max(curve(batches[w]) for w, curve in zip(workers, curves) if batches[w]))
    return np.array(costs), plans


def test_a_3x_straggler_stays_balanced_through_preempted_iterations():
    """Job A's shape: two workers, one 3x slower with a fixed extra cost, 5 % of the
    measurements preempted. The controller balances within 15 rounds and then holds the
    plan (a preempted iteration is not a speed change, noise does not reshuffle it)."""
    curves = [affine(40, 0.9), affine(40, 0.9, slowdown=3, extra_us=80)]
    fast = (3 * 40 + 3 * 0.9 * GLOBAL + 80 - 40) / (4 * 0.9)
    ideal = curves[0](fast)
    means = []
    for seed in range(8):
        lb = LBBSPController(WORKERS[:2], GLOBAL)
        costs, plans = noisy_run(lb, curves, 600, np.random.default_rng(seed))
        assert min(costs[:15]) <= 1.05 * ideal   # balanced within 15 rounds
        means.append(costs[15:].mean() / ideal)
        changes = sum(a != b for a, b in zip(plans[15:], plans[16:]))
        assert changes < 0.4 * len(plans[15:])   # the old controller: ~95 %
    assert max(means) <= 1.10 and np.mean(means) <= 1.04, means   # the old one: 1.17, 1.16


def test_a_straggler_squeezed_by_a_load_spike_gets_its_share_back():
    """Job A's shape, and then 30 rounds in which the straggler's every step takes 2-8x
    longer (a load spike): its batch shrinks to a few samples, where its fixed cost is most
    of its time. Once the spike is over it gets its share back. Before, a tail priced per
    sample from those small batches left it at 1 sample of 512 in 8 of 10 seeds (the
    rounds then cost 1.18x the balanced ones for good)."""
    curves = [affine(40, 0.9), affine(40, 0.9, slowdown=3, extra_us=80)]
    fast = (3 * 40 + 3 * 0.9 * GLOBAL + 80 - 40) / (4 * 0.9)
    ideal = curves[0](fast)
    for seed in range(6):
        lb = LBBSPController(WORKERS[:2], GLOBAL, drop_factor=1e12)   # as engines.param
        rng = np.random.default_rng(seed)
        noisy_run(lb, curves, 100, rng)
        spiked = [curves[0], lambda b, slow=curves[1]: slow(b) * rng.uniform(2, 8)]
        noisy_run(lb, spiked, 30, rng)
        costs, plans = noisy_run(lb, curves, 300, rng)
        assert costs[100:].mean() <= 1.06 * ideal, seed
        assert plans[-1][WORKERS[1]] >= 0.8 * (GLOBAL - fast), (seed, plans[-1])


def test_one_preempted_iteration_moves_nothing():
    curves = [affine(40, 0.9), affine(40, 0.9, slowdown=3)]
    lb = LBBSPController(WORKERS[:2], GLOBAL)
    noisy_run(lb, curves, 30, np.random.default_rng(7), preempted=0.0)
    before = lb.batches()
    lb.observe(WORKERS[0], before[WORKERS[0]], 15 * curves[0](before[WORKERS[0]]))
    lb.observe(WORKERS[1], before[WORKERS[1]], curves[1](before[WORKERS[1]]))
    assert lb.batches() == before


def test_batches_sum_to_global_batch_and_start_equal():
    lb = LBBSPController(WORKERS, 10)
    assert lb.batches() == {w: b for w, b in zip(WORKERS, (3, 3, 2, 2))}
    with pytest.raises(ConfigError):
        LBBSPController(WORKERS, 3)
    with pytest.raises(ConfigError):
        lb.observe(NodeId("stranger"), 1, 1.0)


def test_weighted_aggregation_equals_full_batch_gradient():
    rng = np.random.default_rng(3)
    x, w_true = rng.normal(size=(300, 5)), rng.normal(size=5)
    y = x @ w_true + 0.1 * rng.normal(size=300)
    w = rng.normal(size=5)

    def grad(xb, yb):  # mean-squared-error gradient over one batch
        return 2 * xb.T @ (xb @ w - yb) / len(yb)

    sizes = [170, 90, 35, 5, 0]
    cuts = np.cumsum([0] + sizes)
    grads = [grad(x[a:b], y[a:b]) if b > a else np.zeros(5) for a, b in zip(cuts, cuts[1:])]
    full = grad(x, y)
    assert np.allclose(weighted_average(grads, sizes), full)
    assert not np.allclose(np.mean(grads[:4], axis=0), full)  # the plain mean is biased
    with pytest.raises(ConfigError):
        weighted_average(grads, sizes[:2])


def test_balanced_time_is_the_least_that_fits_the_global_batch():
    """On random measurements (linear, saturating, ties, flat stretches) the common time T
    is the least at which the predicted batches add up to the global batch."""
    rng = np.random.default_rng(4)
    for _ in range(300):
        n = int(rng.integers(1, 7))
        total = int(rng.integers(n, 2000))
        lb = LBBSPController(WORKERS[:n] + [NodeId(f"x{i}") for i in range(max(0, n - 4))],
                             total)
        nodes = list(lb._curves)
        for _ in range(int(rng.integers(n, 4 * n + 1))):
            k = int(rng.integers(len(nodes)))
            batch = int(rng.integers(1, total + 1))
            seconds = (batch / (10.0 * (k + 1)) if rng.random() < 0.5
                       else 0.05 + 0.001 * math.sqrt(batch)) * (1 + 0.3 * rng.random())
            lb.observe(nodes[k], batch, 0.01 if rng.random() < 0.1 else seconds)
        if not all(c.is_known() for c in lb._curves.values()):
            continue
        t, shares = lb._balance(nodes)
        fit = sum(lb._curves[w].batch_for(t) for w in nodes)
        below = sum(lb._curves[w].batch_for(t * (1 - 1e-9)) for w in nodes)
        assert fit >= total - 1e-6 * total and below < total, (t, fit, below)
        assert shares == {w: lb._curves[w].batch_for(t) for w in nodes}

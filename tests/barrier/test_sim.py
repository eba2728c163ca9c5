"""Simulator invariants and the PSP paper's step-progress results, on simulated time."""
from __future__ import annotations

import math

import numpy as np
import pytest

from actorpy.barrier import ASP, BSP, DSSP, PSP, SSP, SimConfig, Workload, simulate
from actorpy.errors import ConfigError

SEEDS = range(10)
H200 = sum(1 / k for k in range(1, 201))


def mean_steps(policy, seeds, **kw):
    return float(np.mean([np.mean(simulate(policy, SimConfig(seed=s, **kw)).per_worker)
                          for s in seeds]))


def spread(result):
    return max(result.per_worker) - min(result.per_worker)


WORKLOADS = [Workload(), Workload(dist="gamma", shape=0.5), Workload(dist="lognormal", shape=1.0),
             Workload(straggler_frac=0.1, straggler_slowdown=5.0),
             Workload(transient_prob=0.05, transient_slowdown=10.0)]


class TestInvariants:
    @pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: f"{w.dist}-{w.straggler_frac}")
    @pytest.mark.parametrize("s", [0, 1, 4])
    def test_ssp_spread_at_most_s_plus_1(self, workload, s):
        for seed in range(3):
            r = simulate(SSP(s), SimConfig(workers=100, seconds=100, workload=workload, seed=seed))
            assert spread(r) <= s + 1

    def test_bsp_spread_at_most_1_and_dssp_at_most_high_plus_1(self):
        w = Workload(straggler_frac=0.05, straggler_slowdown=4.0)
        for seed in range(3):
            cfg = SimConfig(workers=100, seconds=100, workload=w, seed=seed)
            assert spread(simulate(BSP(), cfg)) <= 1
            assert spread(simulate(DSSP(1, 5), cfg)) <= 6

    def test_constant_times_give_exact_counts(self):
        cfg = SimConfig(workers=20, seconds=50, workload=Workload(dist="const", mean_s=2.0))
        for policy in (BSP(), SSP(3), ASP(), PSP(5, 0), DSSP(1, 3)):
            assert simulate(policy, cfg).per_worker == (25,) * 20

    def test_persistent_stragglers_run_at_their_speed_under_asp(self):
        w = Workload(straggler_frac=0.1, straggler_slowdown=4.0)
        r = simulate(ASP(), SimConfig(workers=200, seconds=200, workload=w, seed=3))
        steps = np.asarray(r.per_worker)
        slow = np.sort(steps)[:20]
        assert abs(slow.mean() - 200 / 4.0) < 0.15 * 50
        assert abs(np.sort(steps)[20:].mean() - 200) < 0.05 * 200

    def test_same_seed_same_result_and_seeds_differ(self):
        cfg = SimConfig(workers=50, seconds=50, seed=9)
        assert simulate(PSP(4, 1), cfg) == simulate(PSP(4, 1), cfg)
        assert simulate(PSP(4, 1), cfg).per_worker != simulate(PSP(4, 1), SimConfig(
            workers=50, seconds=50, seed=10)).per_worker

    def test_bad_config(self):
        with pytest.raises(ConfigError):
            SimConfig(workers=0)
        with pytest.raises(ConfigError):
            Workload(dist="weibull")
        with pytest.raises(ConfigError):
            simulate(BSP(), SimConfig(workers=2, seconds=1), engine="warp")

    @pytest.mark.parametrize("engine", ["fast", "reference"])
    def test_a_run_too_long_for_memory_is_refused(self, engine):
        # 1e300 s failed in numpy ("Maximum allowed dimension exceeded", a traceback)
        for cfg in (SimConfig(workers=2, seconds=1e300),
                    SimConfig(workers=2, workload=Workload(mean_s=1e-300)),
                    SimConfig(workers=10**9)):
            with pytest.raises(ConfigError, match="more than this machine's memory"):
                simulate(BSP(), cfg, engine=engine)


class TestEnginesAgree:
    """The fast engine against the reference one, which calls policy.decide on every check."""

    @pytest.mark.parametrize("policy", [BSP(), SSP(2), ASP(), DSSP(1, 4), PSP(11, 1), PSP(0, 0)],
                             ids=repr)
    @pytest.mark.parametrize("workload", [Workload(), Workload(dist="const"),
                                          Workload(straggler_frac=0.2, straggler_slowdown=3.0)],
                             ids=["exp", "const", "stragglers"])
    def test_deterministic_policies_identical(self, policy, workload):
        for seed in range(4):
            cfg = SimConfig(workers=12, seconds=30, workload=workload, seed=seed)
            assert (simulate(policy, cfg).per_worker
                    == simulate(policy, cfg, engine="reference").per_worker)

    @pytest.mark.parametrize("policy", [PSP(2, 0), PSP(4, 1)], ids=repr)
    def test_psp_same_distribution(self, policy):
        runs = 80
        fast = [np.mean(simulate(policy, SimConfig(12, 30, seed=s)).per_worker)
                for s in range(runs)]
        ref = [np.mean(simulate(policy, SimConfig(12, 30, seed=s), engine="reference").per_worker)
               for s in range(runs)]
        se = math.sqrt((np.var(fast) + np.var(ref)) / runs)
        assert abs(np.mean(fast) - np.mean(ref)) < 4 * se


class TestPaperNumbers:
    """200 workers, 200 s, exponential(1 s): the PSP paper's step-progress experiment."""

    def test_bsp_mean_is_200_over_h200(self):
        assert mean_steps(BSP(), SEEDS) == pytest.approx(200 / H200, rel=0.02)

    def test_asp_mean_is_200(self):
        assert mean_steps(ASP(), SEEDS) == pytest.approx(200.0, rel=0.02)

    def test_ordering_bsp_ssp_pssp_asp(self):
        seeds = range(3)
        means = [mean_steps(p, seeds) for p in (BSP(), SSP(4), PSP(10, 4), ASP())]
        assert means == sorted(means) and len(set(means)) == 4

    def test_beta_sweep_falls_monotonically_and_narrows(self):
        seeds = range(3)
        means, stds = [], []
        for beta in (0, 1, 2, 4, 8, 16, 32, 64):
            runs = [simulate(PSP(beta, 0), SimConfig(seed=s)).per_worker for s in seeds]
            means.append(np.mean(runs))
            stds.append(np.mean([np.std(r) for r in runs]))
        assert all(a > b for a, b in zip(means, means[1:])), means
        assert stds[0] > stds[1] > stds[3] > stds[-1], stds


def test_asp_closed_form_matches_the_event_loop():
    from actorpy.barrier.fastsim import run_fast
    from actorpy.barrier.sim import durations_for
    for seed in range(3):
        cfg = SimConfig(workers=40, seconds=60, seed=seed,
                        workload=Workload(transient_prob=0.1, transient_slowdown=3.0))
        closed = simulate(ASP(), cfg).per_worker
        assert tuple(run_fast(ASP(), None, cfg, durations_for(cfg))) == closed
        assert tuple(run_fast(PSP(0, 2), None, cfg, durations_for(cfg))) == closed

"""Property tests of the barrier decisions (pure: no clock, no sockets)."""
from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings, strategies as st

from actorpy.barrier import ASP, BSP, DSSP, PSP, SSP, Decision, FullView, SampledView
from actorpy.barrier.view import StepView
from actorpy.errors import ConfigError
from actorpy.ids import NodeId

names = st.text(alphabet="abcdefghij", min_size=1, max_size=3).map(NodeId)
tables = st.dictionaries(names, st.integers(0, 30), max_size=12)
steps = st.integers(0, 40)
small = st.integers(0, 6)
seeds = st.integers(0, 2**32 - 1)
SETTINGS = settings(max_examples=150, deadline=None)


def reordered(table):
    return dict(reversed(list(table.items())))


class TestSSPFamily:
    @SETTINGS
    @given(tables, steps)
    def test_ssp0_is_bsp(self, table, me):
        assert SSP(0).decide(me, FullView(table)) == BSP().decide(me, FullView(table))

    @SETTINGS
    @given(tables, steps, small)
    def test_rule_is_c_minus_min_le_s(self, table, me, s):
        expected = not table or me - min(table.values()) <= s
        d = SSP(s).decide(me, FullView(table))
        assert d.advance == expected
        assert d.waiting_on == tuple(sorted(n for n, c in table.items() if c < me - s))

    @SETTINGS
    @given(tables, steps)
    def test_asp_always_advances(self, table, me):
        assert ASP().decide(me, FullView(table)) == Decision(True, ())

    @SETTINGS
    @given(tables, steps, small, st.integers(1, 5))
    def test_more_staleness_never_turns_advance_into_wait(self, table, me, s, extra):
        if SSP(s).decide(me, FullView(table)).advance:
            assert SSP(s + extra).decide(me, FullView(table)).advance

    @SETTINGS
    @given(tables, steps, small)
    def test_ignores_view_order_and_does_not_mutate(self, table, me, s):
        before = dict(table)
        a = SSP(s).decide(me, FullView(table))
        assert a == SSP(s).decide(me, FullView(reordered(table)))
        assert table == before

    @SETTINGS
    @given(tables, steps, small)
    def test_nobody_advances_more_than_s_ahead_of_what_it_saw(self, table, me, s):
        if table and SSP(s).decide(me, FullView(table)).advance:
            assert me - min(table.values()) <= s

    def test_exclude_drops_the_deciding_node(self):
        table = {NodeId("me"): 0, NodeId("b"): 5}
        assert BSP().decide(5, FullView(table, exclude=NodeId("me"))).advance
        assert not BSP().decide(5, FullView(table)).advance


class TestPSP:
    @SETTINGS
    @given(tables, steps, small, seeds)
    def test_beta0_is_asp(self, table, me, s, seed):
        view = FullView(table, rng=random.Random(seed))
        assert PSP(0, s).decide(me, view) == ASP().decide(me, view)

    @SETTINGS
    @given(st.lists(st.tuples(tables, steps), min_size=1, max_size=6), small, seeds)
    def test_full_sample_is_ssp_decision_for_decision(self, checks, s, seed):
        rng_a, rng_b = random.Random(seed), random.Random(seed)
        for table, me in checks:
            beta = max(1, len(table))  # beta = P - 1: everyone else
            a = PSP(beta, s).decide(me, FullView(table, rng=rng_a))
            b = SSP(s).decide(me, FullView(table, rng=rng_b))
            assert a == b
        assert rng_a.getstate() == rng_b.getstate()  # no randomness was consumed

    @SETTINGS
    @given(tables, steps, small, st.integers(1, 12), seeds)
    def test_sampled_view_makes_ssp_into_psp(self, table, me, s, beta, seed):
        a = PSP(beta, s).decide(me, FullView(table, rng=random.Random(seed)))
        b = SSP(s).decide(me, SampledView(table, beta, random.Random(seed)))
        assert a == b

    @SETTINGS
    @given(tables, steps, small, st.integers(1, 12), seeds, st.integers(1, 4))
    def test_more_staleness_never_turns_advance_into_wait(self, table, me, s, beta, seed, extra):
        if PSP(beta, s).decide(me, FullView(table, rng=random.Random(seed))).advance:
            assert PSP(beta, s + extra).decide(me, FullView(table, rng=random.Random(seed))).advance

    @SETTINGS
    @given(tables, steps, small, st.integers(1, 12), seeds)
    def test_ignores_view_order(self, table, me, s, beta, seed):
        a = PSP(beta, s).decide(me, FullView(table, rng=random.Random(seed)))
        b = PSP(beta, s).decide(me, FullView(reordered(table), rng=random.Random(seed)))
        assert a == b

    def test_each_check_draws_a_fresh_sample(self):
        table = {NodeId(f"n{i:02d}"): i for i in range(20)}
        view = SampledView(table, 3, random.Random(5))
        samples = {tuple(sorted(view.steps())) for _ in range(20)}
        assert len(samples) > 10
        assert all(len(s) == 3 for s in samples)

    @pytest.mark.parametrize("population,lagging,beta", [(10, 3, 4), (7, 1, 1), (12, 5, 6),
                                                         (5, 0, 3), (6, 2, 5)])
    def test_pass_probability_is_exact(self, population, lagging, beta):
        # enumerate every sample: the fraction that holds no laggard
        combos = list(itertools.combinations(range(population), beta))
        clean = sum(all(i >= lagging for i in c) for c in combos)
        assert PSP(beta).pass_probability(lagging, population) == pytest.approx(clean / len(combos))

    def test_decide_passes_at_the_hypergeometric_rate(self):
        table = {NodeId(f"n{i:02d}"): (0 if i < 3 else 9) for i in range(10)}
        rng = random.Random(11)
        policy = PSP(sample=4, staleness=2)
        trials = 6000
        passes = sum(policy.decide(9, FullView(table, rng=rng)).advance for _ in range(trials))
        p = policy.pass_probability(3, 10)  # C(7,4)/C(10,4) = 1/6
        assert p == pytest.approx(1 / 6)
        assert abs(passes / trials - p) < 4 * math.sqrt(p * (1 - p) / trials)


class TestDSSPPolicy:
    @SETTINGS
    @given(tables, steps, small, small, st.integers(-3, 20))
    def test_never_more_than_high_ahead(self, table, me, low, width, granted):
        policy = DSSP(low=low, high=low + width)
        if table and policy.decide(me, FullView(table), granted).advance:
            assert me - min(table.values()) <= policy.high

    @SETTINGS
    @given(tables, steps, small, small)
    def test_no_grant_is_ssp_low(self, table, me, low, width):
        assert (DSSP(low, low + width).decide(me, FullView(table))
                == SSP(low).decide(me, FullView(table)))


class TestArguments:
    @pytest.mark.parametrize("make", [lambda: SSP(-1), lambda: PSP(-2), lambda: PSP(3, -1),
                                      lambda: DSSP(3, 2), lambda: SSP(1.5)])
    def test_bad_arguments_raise_config_error(self, make):
        with pytest.raises(ConfigError):
            make()

    def test_numpy_integers_are_taken_and_kept_as_ints(self):
        # before: a sweep over np.arange was refused ("staleness must be an integer")
        import numpy as np
        policies = [SSP(np.int64(3)), PSP(np.int32(2), np.int64(4)), DSSP(np.int8(1), np.int64(5))]
        assert policies == [SSP(3), PSP(2, 4), DSSP(1, 5)]
        assert [repr(p) for p in policies] == ["SSP(staleness=3)", "PSP(sample=2, staleness=4)",
                                               "DSSP(low=1, high=5)"]
        with pytest.raises(ConfigError, match="sample \\(beta\\) must be an integer"):
            PSP(True, 1)
        with pytest.raises(ConfigError, match="^low \\(a staleness\\) must be an integer"):
            DSSP(-1, 2)   # it said "staleness must be ...", naming no argument of DSSP

    def test_sampling_without_rng_says_what_to_pass(self):
        view = FullView({NodeId("a"): 1, NodeId("b"): 2})
        with pytest.raises(ConfigError, match="rng="):
            PSP(1).decide(3, view)

    def test_views_satisfy_the_protocol(self):
        assert isinstance(FullView({}), StepView)
        assert isinstance(SampledView({}, 1, random.Random(0)), StepView)

"""DSSP's controller, the PSP bounds, and the `actorpy sim` command line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from actorpy.barrier import DSSP, SSP, DSSPController, FullView, SimConfig, Workload, simulate
from actorpy.barrier.bounds import psp_bounds
from actorpy.barrier.cli import main
from actorpy.errors import ConfigError
from actorpy.ids import NodeId

FAST, SLOW = NodeId("fast"), NodeId("slow")


def controller_with(low, high, fast_period, slow_period, slow_last):
    c = DSSPController(DSSP(low, high))
    for k in range(3):
        c.observe(FAST, k, k * fast_period)
    c.observe(SLOW, 0, slow_last - slow_period)
    c.observe(SLOW, 1, slow_last)
    return c


class TestDSSPController:
    @pytest.mark.parametrize("fast_period,slow_period,slow_last", [
        (1.0, 4.0, 1.5), (1.0, 10.0, 2.0), (0.5, 1.2, 1.0), (2.0, 3.0, 0.0)])
    def test_grant_minimises_predicted_wait(self, fast_period, slow_period, slow_last):
        low, high = 1, 6
        c = controller_with(low, high, fast_period, slow_period, slow_last)
        me, now = 3, 2 * fast_period
        grant = c.choose_extra(FAST, me, now, SLOW, 1)
        # brute force: slow must reach me - low steps; it last pushed step 1 at slow_last
        ready = slow_last + max(me - low - 1, 0) * slow_period
        waits = [max(0.0, ready - (now + r * fast_period)) for r in range(high - low + 1)]
        assert grant.extra == int(np.argmin(waits))  # first minimum: least staleness
        assert grant.predicted_wait_s == pytest.approx(min(waits))

    def test_no_history_means_no_grant(self):
        c = DSSPController(DSSP(0, 5))
        d = c.on_push(FAST, 3, 1.0, FullView({SLOW: 0}))
        assert (d.advance, c.granted(FAST)) == (False, 0)

    def test_only_the_fastest_gets_a_grant_and_it_expires(self):
        c = controller_with(0, 4, 1.0, 5.0, 0.0)
        view = FullView({SLOW: 1, NodeId("faster"): 9})
        assert not c.on_push(FAST, 3, 2.0, view).advance and c.granted(FAST) == 0
        assert c.on_push(FAST, 3, 2.0, FullView({SLOW: 1})).advance and c.granted(FAST) > 0
        c.on_push(FAST, 4, 3.0, FullView({SLOW: 4}))
        assert c.granted(FAST) == 0

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, 4), st.floats(0.01, 5.0)), min_size=5, max_size=60),
           st.integers(0, 3), st.integers(0, 4))
    def test_nobody_gets_more_than_high_ahead(self, pushes, low, width):
        policy = DSSP(low, low + width)
        c = DSSPController(policy)
        nodes = [NodeId(f"n{i}") for i in range(5)]
        steps = {n: 0 for n in nodes}
        now = 0.0
        for who, dt in pushes:
            now += dt
            me = nodes[who]
            steps[me] += 1
            d = c.on_push(me, steps[me], now, FullView(steps, exclude=me))
            assert 0 <= c.granted(me) <= policy.max_extra
            if d.advance:
                assert steps[me] - min(steps.values()) <= policy.high

    def test_simulated_dssp_sits_between_its_bounds(self):
        w = Workload(straggler_frac=0.1, straggler_slowdown=3.0)
        means = {}
        for name, p in (("low", SSP(1)), ("dssp", DSSP(1, 6)), ("high", SSP(6))):
            means[name] = np.mean([np.mean(simulate(p, SimConfig(100, 100, w, seed=s)).per_worker)
                                   for s in range(3)])
        assert means["low"] < means["dssp"] <= means["high"]


class TestBounds:
    def test_paper_example(self):
        b = psp_bounds(staleness=4, sample=1, lag_cdf=0.5, updates=10_000)
        assert (b.a, b.s) == (0.5, pytest.approx(2 / 3))
        assert b.mean == pytest.approx(14.6667, abs=1e-3)
        assert b.variance == pytest.approx(73.3333, abs=1e-3)

    def test_large_sample_limit(self):
        r, f = 4, 0.5
        b = psp_bounds(r, 200, f, 10_000)  # a -> 0, S -> 1 / F(r)
        assert b.mean == pytest.approx(r * (r + 1) / 2 / f)
        assert b.variance == pytest.approx(r * (r + 1) * (2 * r + 1) / 6 / f)

    @pytest.mark.parametrize("args", [(4, 0, 0.5, 100), (4, 1, 1.0, 100), (4, 1, 0.5, 3),
                                      (-1, 1, 0.5, 100)])
    def test_undefined_arguments(self, args):
        with pytest.raises(ConfigError):
            psp_bounds(*args)


class TestCLI:
    def test_json_contract(self, capsys):
        assert main(["--workers", "30", "--seconds", "20", "--barrier", "pssp", "--sample",
                     "5", "--staleness", "2", "--seed", "4", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["barrier"] == "PSP(sample=5, staleness=2)"
        assert set(out["steps"]) == {"mean", "std", "min", "max", "p5", "p50", "p95"}
        assert len(out["per_worker"]) == 30 and out["total_updates"] == sum(out["per_worker"])
        assert out["config"]["workers"] == 30 and out["config"]["seed"] == 4
        assert out["steps"]["mean"] == pytest.approx(np.mean(out["per_worker"]))

    @pytest.mark.parametrize("argv,message", [
        (["--workers", "0"], "--workers"), (["--barrier", "xsp"], "invalid choice"),
        (["--compare", "ssp:x"], "integers"), (["--barrier", "pbsp", "--staleness", "3"], "pssp"),
        (["--sweep-sample", "1", "2"], "--barrier pbsp"), (["--bounds", "--lag-cdf", "2"], "F(r)"),
        (["--bounds", "--compare", "bsp"], "leave out --compare"),   # before: one was ignored
        (["--compare", "bsp", "--sweep-sample", "1", "2"], "give one"),
        # before: each of these was dropped without a word (dssp ran as DSSP(2, 6))
        (["--barrier", "dssp", "--staleness", "9"], "takes --dssp-low and --dssp-high"),
        (["--barrier", "bsp", "--staleness", "2"], "--staleness is for ssp, pbsp and pssp"),
        (["--barrier", "asp", "--sample", "3"], "--sample is PSP's sample size"),
        (["--barrier", "pssp", "--sample", "3", "--sweep-sample", "1", "2"], "leave out --sample"),
        (["--compare", "bsp", "ssp:2", "--staleness", "3"], "carry their own parameters"),
        (["--bounds", "--plot", "b.png"], "draws nothing: leave out --plot"),
        (["--dist", "exp", "--mean", "-1"], "--mean"), (["--seconds", "inf"], "finite"),
        (["--mean", "inf"], "finite"), (["--seed", "-1"], "--seed must be an int >= 0"),
        (["--workers", "5", "--seconds", "5", "--plot", "/nonexistent-dir/x.png"], "no directory"),
        (["--workers", "5", "--seconds", "5", "--plot", "steps.txt"], "no .txt files"),
        # before: an empty --plot (an unset variable) drew nothing and said nothing
        (["--workers", "5", "--seconds", "5", "--plot", ""], "--plot needs a file name"),
        # before: matplotlib wrote /dev/full.png, a file in /dev
        (["--workers", "5", "--seconds", "5", "--plot", "/dev/full"], "not a regular file")])
    def test_bad_arguments_exit_2_with_a_message(self, capsys, argv, message):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err

    def test_plot_to_a_directory_is_refused(self, capsys, tmp_path):
        # matplotlib would write DIR.png beside it, and the run said "plot written to DIR"
        assert main(["--workers", "5", "--seconds", "5", "--plot", str(tmp_path)]) == 2
        assert "is a directory" in capsys.readouterr().err
        assert not os.path.exists(f"{tmp_path}.png")

    def test_a_plot_named_without_a_suffix_is_said_where_it_went(self, capsys, tmp_path):
        # before: "plot written to DIR/steps", and matplotlib had written DIR/steps.png
        assert main(["--workers", "5", "--seconds", "5", "--plot", str(tmp_path / "steps")]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == f"plot written to {tmp_path}/steps.png"
        assert os.listdir(tmp_path) == ["steps.png"]

    def test_compare_sweep_and_plot(self, capsys, tmp_path):
        png = tmp_path / "cmp.png"
        assert main(["--workers", "40", "--seconds", "40", "--compare", "bsp", "ssp:2", "asp",
                     "--plot", str(png)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split()[0] == "barrier" and lines[3].startswith("ASP()")
        assert lines[3].split()[-1] == "1.000"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 150_000
        assert main(["--workers", "40", "--seconds", "40", "--barrier", "pbsp",
                     "--sweep-sample", "0", "4", "--json"]) == 0
        runs = json.loads(capsys.readouterr().out)["compare"]
        assert [r["barrier"] for r in runs] == ["PSP(sample=0, staleness=0)",
                                                "PSP(sample=4, staleness=0)"]

    def test_bounds_table(self, capsys):
        assert main(["--bounds", "--staleness", "4", "--sample", "1", "--json"]) == 0
        row = json.loads(capsys.readouterr().out)["bounds"][0]
        assert row["mean"] == pytest.approx(14.6667, abs=1e-3)

    def test_runs_as_a_module(self):
        proc = subprocess.run([sys.executable, "-m", "actorpy.barrier.cli", "--workers", "5",
                               "--seconds", "3", "--dist", "const", "--json"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["per_worker"] == [3] * 5

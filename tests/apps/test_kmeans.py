"""`actorpy kmeans`: converges to the generating centres (iterations over a cached dataset)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from actorpy.errors import ConfigError
from apps import kmeans


def test_kmeans_finds_the_generating_centres(capsys):
    assert kmeans.main(["--k", "4", "--points", "20000", "--dim", "3", "--partitions", "5",
                        "--seed", "3", "--workers", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    centres = np.array(report["centres"])
    points, true = kmeans.make_points(k=4, points=20_000, dim=3, seed=3)
    assert np.allclose(report["true_centres"], true)
    assert kmeans.centre_error(centres, true) < 0.05
    assert 1 <= report["iterations"] <= 50
    # the answer is a fixed point of Lloyd's step over all the points
    sums, counts, inertia = kmeans.partial_sums(points, centres)
    assert np.allclose(sums / counts[:, None], centres, atol=1e-6)
    assert np.isclose(inertia, report["inertia"], rtol=1e-6)


def test_the_seeding_finds_every_centre_of_many():
    # before: at k = 150 (seed 2) one draw a centre missed true centres (one by 27, inertia
    # 3.9x sklearn's), after ~40 s of distances computed again from every centre
    points, true = kmeans.make_points(k=150, points=20_000, dim=20, seed=2)
    rng = np.random.default_rng(2)
    centres = kmeans.local_kmeans(points[rng.permutation(len(points))[:7500]], 150, rng)
    assert kmeans.centre_error(centres, true) < 1.0


def test_the_inertia_is_of_the_centres_returned_when_iterations_run_out(capsys):
    # before: of the centres one update earlier (295 612 reported, 288 812 for those shown)
    assert kmeans.main(["--k", "8", "--points", "5000", "--dim", "4", "--iterations", "1",
                        "--seed", "1", "--workers", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    points, _ = kmeans.make_points(k=8, points=5000, dim=4, seed=1)
    inertia = kmeans.partial_sums(points, np.array(report["centres"]))[2]
    assert report["iterations"] == 1
    assert np.isclose(report["inertia"], inertia, rtol=1e-9)


def test_more_partitions_than_points(capsys):
    # the seeding sample came from the first block only: 1 point, or none, for 5 centres
    for points, partitions in ((100, 1000), (5, 3), (40, 30)):
        assert kmeans.main(["--k", "5", "--points", str(points), "--partitions", str(partitions),
                            "--workers", "1", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert len(report["centres"]) == 5 and np.isfinite(report["inertia"])


def test_more_centres_than_fit_is_refused_not_a_hang(capsys):
    # 60 centres 8 apart do not fit in [-20, 20]^2: the generator used to draw for ever
    with pytest.raises(SystemExit) as exit_:
        kmeans.main(["--k", "60", "--points", "2000", "--dim", "2", "--workers", "1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "room for only" in err and "--dim" in err and "Traceback" not in err


def test_negative_seed_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        kmeans.main(["--seed", "-1", "--workers", "1"])
    assert exit_.value.code == 2
    assert "--seed must be an int >= 0, got -1" in capsys.readouterr().err


def test_points_beyond_the_memory_available_are_refused_before_making_them(capsys):
    # numpy refuses this size itself; sizes just over what is free are allocated, then
    # filled until the OOM killer ends some process
    with pytest.raises(ConfigError, match="--points and --dim need about"):
        kmeans.main(["--points", str(10**12), "--dim", "2", "--workers", "1"])


def test_partitions_past_the_cap_are_refused_before_a_cluster_starts():
    # before: --partitions 10**9 made one block a point (20k tasks an iteration) and ran
    # for minutes; with 100 points the old code finished in seconds and returned 0
    with pytest.raises(ConfigError, match=f"--partitions {10**9} is more than "
                                          f"{kmeans.MAX_PARTITIONS}"):
        kmeans.main(["--partitions", str(10**9), "--points", "100", "--workers", "1"])


@pytest.mark.parametrize("flags, said", [
    (["--k", "0"], "--k 0: must be >= 1"),
    (["--dim", "0", "--iterations", "-2"], "--dim 0, --iterations -2: must be >= 1"),
    (["--k", "10", "--points", "5"], "--points 5 is fewer than --k 10"),
], ids=["k", "two", "points"])
def test_a_bad_size_flag_is_named(capsys, flags, said):
    # before: "--k, --points, --dim, --partitions, --iterations must be >= 1 and --points >=
    # --k", whichever one was wrong
    with pytest.raises(SystemExit) as exit_:
        kmeans.main(flags + ["--workers", "1"])
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


def test_a_centre_of_many_dimensions_prints_on_one_short_line(capsys):
    # before: --dim 100000 printed each centre's 100000 coordinates
    assert kmeans.main(["--k", "2", "--points", "10", "--dim", "50", "--iterations", "2",
                        "--workers", "1"]) == 0
    centres = [line for line in capsys.readouterr().out.splitlines() if "centre " in line]
    assert len(centres) == 2
    for line in centres:
        assert line.endswith(" ... (42 more; --json has all)") and len(line) < 120


def test_every_option_says_what_it_is_in_help(capsys):
    # before: --points, --dim and --seed were listed bare
    with pytest.raises(SystemExit) as info:
        kmeans.main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for flag, words in (("--points POINTS", "points generated around k"),
                        ("--dim DIM", "coordinates per point"),
                        ("--seed SEED", "seed of the generated points")):
        after = text.split(f"  {flag}", 1)[1]
        assert " ".join(after.split()).startswith(words), (flag, after[:80])


def test_a_run_past_its_timeout_names_the_flag(capsys):
    """kmeans had no --timeout (each action waited up to 600 s, whatever the user wanted);
    it takes one like every other app, checked, and a run past it names it."""
    assert kmeans.main(["--workers", "1", "--points", "2000", "--timeout", "1e-6"]) == 1
    assert capsys.readouterr().err.startswith(
        "actorpy kmeans: a step did not finish within --timeout 1e-06 s; raise --timeout")
    with pytest.raises(SystemExit) as exit_:
        kmeans.main(["--timeout", "nan"])
    assert exit_.value.code == 2 and "must be a finite number > 0" in capsys.readouterr().err

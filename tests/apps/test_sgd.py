"""`actorpy sgd`: the CLI's JSON contract, every barrier flag, --compare with a plot, and
training on an existing cluster that grows while it runs."""
from __future__ import annotations

import errno
import functools
import importlib
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import actorpy
from actorpy.barrier import ASP, BSP, PSP, SSP
from actorpy.errors import ConfigError
from apps import p2p_sgd, sgd
from apps.training import (barriers_from_args, default_lr, in_cli_words, job_name,
                           parse_barrier)
from engines import param
from engines.param.errors import CheckpointError
from tests.conftest import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIELDS = {"loss", "weight_error", "steps_per_worker", "updates", "seconds"}


def spy_on_start(monkeypatch, option):
    """The ``option=`` every ``param.Job.start`` of the test is given, in a list."""
    seen = []
    start = param.Job.start

    def spy(job, *args, **kwargs):
        seen.append(kwargs.get(option))
        return start(job, *args, **kwargs)
    monkeypatch.setattr(param.Job, "start", spy)
    return seen


class TestSGD:
    def test_cli_json_is_the_only_output(self):
        out = subprocess.run([sys.executable, "-m", "actorpy", "sgd", "--model", "linear",
                              "--workers", "2", "--barrier", "pssp", "--sample", "1",
                              "--staleness", "2", "--steps", "80", "--seed", "3", "--json"],
                             capture_output=True, text=True, timeout=120, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": ROOT})
        assert out.returncode == 0, out.stderr[-2000:]
        result = json.loads(out.stdout)
        assert set(result) == FIELDS
        assert len(result["steps_per_worker"]) == 2 and min(result["steps_per_worker"]) >= 80
        assert result["updates"] == sum(result["steps_per_worker"])
        assert result["weight_error"] < 0.05 and 0 < result["seconds"] < 60
        assert result["loss"] < 0.05   # noise floor 0.01

    def test_cli_diverged_runs_say_so_as_the_command(self):
        # before: "actorpy: bsp: training diverged ...", where every other line of the
        # command says "actorpy sgd: ..." (a bad flag's, a lost cluster's)
        out = subprocess.run([sys.executable, "-m", "actorpy", "sgd", "--workers", "1",
                              "--steps", "20", "--lr", "1e6", "--compare", "bsp", "asp",
                              "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": ROOT})
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stderr.splitlines() == [
            f"actorpy sgd: {b}: training diverged (loss is nan); try a smaller --lr"
            for b in ("bsp", "asp")]
        assert [r["loss"] for r in json.loads(out.stdout)["runs"]] == [None, None]

    def test_compare_logistic_with_plot(self, tmp_path, capsys):
        plot = tmp_path / "curves.png"
        assert sgd.main(["--model", "logistic", "--compare", "bsp", "dssp:0:2", "--steps", "60",
                         "--plot", str(plot), "--json"]) == 0
        runs = json.loads(capsys.readouterr().out)["runs"]
        assert [r["barrier"] for r in runs] == ["bsp", "dssp:0:2"]
        for r in runs:
            assert set(r) == FIELDS | {"barrier"} and r["weight_error"] < 0.9
            assert r["loss"] < 0.69   # better than chance (ln 2)
        assert plot.stat().st_size > 10_000

    @pytest.mark.parametrize("flag, expected", [
        ("bsp", "BSP(staleness=0)"), ("asp", "ASP()"), ("ssp", "SSP(staleness=3)"),
        ("pbsp", "PSP(sample=2, staleness=0)"), ("pssp", "PSP(sample=2, staleness=3)"),
        ("dssp", "DSSP(low=3, high=7)")])
    def test_barrier_flags(self, flag, expected):
        staleness = ["--staleness", "3"] if flag in ("ssp", "pssp", "dssp") else []
        args = sgd.build_parser().parse_args(["--barrier", flag, *staleness])
        assert repr(barriers_from_args(args)[0][1]) == expected

    @pytest.mark.parametrize("argv, words", [
        (["--barrier", "bsp", "--staleness", "8"], "--staleness applies to ssp, pssp, dssp "
                                                   "only: --barrier bsp has none"),
        (["--barrier", "ssp", "--sample", "3"], "--sample applies to pbsp, pssp only"),
        (["--barrier", "pssp", "--high", "9"], "--high applies to dssp only"),
        (["--compare", "bsp", "ssp:2", "--staleness", "3"], "--compare's specs carry their "
                                                            "own numbers")])
    def test_a_barrier_number_the_barrier_does_not_use_is_refused(self, argv, words):
        # before: ignored without a word (`--barrier bsp --staleness 8` trained under BSP)
        args = sgd.build_parser().parse_args(argv)
        with pytest.raises(ConfigError, match=words):
            barriers_from_args(args)

    def test_bad_specs(self):
        with pytest.raises(ConfigError, match="not understood"):
            parse_barrier("ssp")
        with pytest.raises(ConfigError, match="numbers expected"):
            parse_barrier("pssp:a:b")
        with pytest.raises(ConfigError, match=">= 1"):
            sgd.main(["--steps", "0"])
        for lr in ("nan", "inf", "0", "-0.1", "x"):
            with pytest.raises(SystemExit):
                sgd.build_parser().parse_args(["--lr", lr])
        for parser in (sgd.build_parser(), p2p_sgd.build_parser()):   # before: taken; a
            for target in ("nan", "-1", "0"):                          # run never stopped early
                with pytest.raises(SystemExit):
                    parser.parse_args(["--target", target])

    def test_a_plot_file_in_no_directory_is_refused_before_training(self):
        # before: the error came after the whole training run
        for main in (sgd.main, p2p_sgd.main):
            with pytest.raises(ConfigError, match="--plot /nonexistent/x.png: there is no "
                                                  "directory /nonexistent"):
                main(["--plot", "/nonexistent/x.png", "--workers", "0"])

    def test_balance_with_asp_is_refused_before_training(self):
        # before: `--compare bsp asp --balance` trained the bsp run, then failed on asp with
        # the API's words, and the bsp result was lost
        for flags in (["--compare", "bsp", "asp"], ["--barrier", "asp"]):
            with pytest.raises(ConfigError, match="--balance resizes batches .* every run needs "
                                                  "a barrier that holds .*, not asp"):
                sgd.main([*flags, "--balance", "--workers", "0"])

    def test_data_beyond_the_memory_available_is_refused_before_anything_runs(self):
        # before: `--features 2000000 --rows 8` spent 100 s making the 2000 x 2e6 held-out
        # rows (16 GB) on a 23 GB machine and was killed by the OOM killer (exit 137)
        for main in (sgd.main, p2p_sgd.main):
            with pytest.raises(ConfigError, match="--rows and --features need about .* GiB of "
                                                  "memory, more than the .* GiB available"):
                main(["--features", str(10**9), "--rows", "8", "--workers", "0"])

    def test_a_plot_path_that_cannot_be_a_plot_is_refused_before_training(self, tmp_path):
        # before: a directory was written as DIR.png; an unknown format failed with
        # matplotlib's traceback after the whole training run, and the results were lost
        for main in (sgd.main, p2p_sgd.main):
            with pytest.raises(ConfigError, match="is a directory; name a file in it"):
                main(["--plot", str(tmp_path), "--workers", "0"])
            with pytest.raises(ConfigError, match="matplotlib writes no .jpgz files; use "
                                                  "one of .*png"):
                main(["--plot", str(tmp_path / "x.jpgz"), "--workers", "0"])
        assert list(tmp_path.iterdir()) == []

    def test_a_plot_path_that_is_a_fifo_is_refused_before_training(self, tmp_path):
        # before: trained, then "--plot F: cannot write it: File or stream is not seekable"
        os.mkfifo(tmp_path / "curves.png")
        with pytest.raises(ConfigError, match="curves.png is not a regular file"):
            sgd.main(["--plot", str(tmp_path / "curves.png"), "--workers", "0"])

    @pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs sysfs")
    def test_a_plot_path_it_may_not_write_is_refused_before_training(self, tmp_path):
        # before: trained, then "--plot F: cannot write it: Permission denied" (sysfs takes
        # no new files, whoever asks; a read-only file system failed the same way)
        for main in (sgd.main, p2p_sgd.main):
            with pytest.raises(ConfigError, match="--plot /sys/curves.png: cannot write it: "
                                                  "Permission denied"):
                main(["--plot", "/sys/curves.png", "--workers", "0"])
        existing = tmp_path / "curves.png"
        existing.write_bytes(b"kept")
        with pytest.raises(ConfigError, match="--workers must be"):   # the probe passed
            sgd.main(["--plot", str(existing), "--workers", "0"])
        assert existing.read_bytes() == b"kept"
        with pytest.raises(ConfigError, match="--workers must be"):
            sgd.main(["--plot", str(tmp_path / "new.png"), "--workers", "0"])
        assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]   # the probe is gone
        link = tmp_path / "link.png"
        link.symlink_to(tmp_path / "gone" / "curves.png")   # a path open() cannot create
        with pytest.raises(ConfigError, match=f"--plot {link}: cannot write it: No such"):
            sgd.main(["--plot", str(link), "--workers", "0"])
        link.unlink()
        link.symlink_to(tmp_path / "target.png")   # one it can: the link stays a link
        with pytest.raises(ConfigError, match="--workers must be"):
            sgd.main(["--plot", str(link), "--workers", "0"])
        assert link.is_symlink() and not (tmp_path / "target.png").exists()

    def test_a_run_past_its_timeout_names_the_flag(self):
        # before: "within timeout_s=1.0; raise it, or check the stop function and the
        # workers' logs": the API's words, where the command has --timeout and no stop function
        with pytest.raises(actorpy.ActorpyTimeout) as info:
            sgd.main(["--timeout", "1", "--steps", str(10**7), "--workers", "1"])
        # the steps, or (a loaded host: the second ran out before the worker joined) who
        # has not joined
        assert re.fullmatch(r"job 'sgd-linear-[0-9a-f]{6}' did not finish within --timeout 1 "
                            r"s(?: \(steps completed: w-\w+ (?:\d+|-; w-\w+ has not joined: "
                            r"[^()]*)\))?; raise --timeout \(or lower --steps\)",
                            info.value.cli_message)

    def test_an_empty_plot_path_is_refused_before_training(self):
        # before: `--plot "$UNSET"` trained, drew nothing and said nothing (exit 0)
        for main in (sgd.main, p2p_sgd.main):
            with pytest.raises(ConfigError, match="--plot needs a file name"):
                main(["--plot", "", "--workers", "0"])

    @pytest.mark.parametrize("main, flags", [(sgd.main, []), (p2p_sgd.main, ["--peers", "1"])],
                             ids=["sgd", "p2p-sgd"])
    def test_a_plot_that_cannot_be_written_keeps_the_results(self, tmp_path, capsys, main,
                                                              flags, monkeypatch):
        plot = tmp_path / "curves.png"
        import matplotlib.figure   # a disk that fills up while it trains

        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
        with pytest.raises(ConfigError, match=f"--plot {plot}: cannot write it: No space"):
            main([*flags, "--steps", "5", "--workers", "1", "--plot", str(plot), "--json"])
        assert set(json.loads(capsys.readouterr().out)) == FIELDS   # printed before the plot

    # With 2 workers the server averages their updates (before: numpy's RuntimeWarning from
    # the engine's mean reached stderr, in the worker processes: hence capfd).
    @pytest.mark.parametrize("workers", ["1", "2"])
    def test_a_diverged_run_says_so_and_keeps_the_json_valid(self, capfd, workers):
        assert sgd.main(["--lr", "1e6", "--steps", "20", "--workers", workers, "--json"]) == 0
        out, err = capfd.readouterr()
        result = json.loads(out)   # strict JSON: NaN would not be
        assert result["loss"] is None and result["weight_error"] is None
        assert "training diverged" in err and "--lr" in err and "RuntimeWarning" not in err


    def test_the_default_lr_holds_with_8_workers_under_ssp(self, capsys):
        """Before, --lr defaulted to 0.1 whatever the workers: 8 under SSP(4) ended at a
        weight error of 0.40 after 150 steps (5.2 after 500: diverging)."""
        assert sgd.main(["--barrier", "ssp", "--workers", "8", "--steps", "150",
                         "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["weight_error"] < 0.05

    def test_default_lr_scales_with_workers_unless_rounds_are_averaged(self):
        assert default_lr("linear", SSP(4), 4, averaged=True) == 0.1
        assert default_lr("linear", SSP(4), 16, averaged=True) == pytest.approx(0.025)
        assert default_lr("logistic", ASP(), 8, averaged=True) == pytest.approx(0.5)
        # the PS engine averages a BSP round's updates; a P2P owner folds each push alone
        assert default_lr("linear", BSP(), 16, averaged=True) == 0.1
        assert default_lr("linear", BSP(), 16, averaged=False) == pytest.approx(0.025)
        assert default_lr("linear", PSP(2, 0), 8, averaged=True) == pytest.approx(0.05)

    def test_the_default_lr_holds_with_many_features(self, capsys):
        # before: lr 0.1 whatever the features; --features 2000 went to a loss of 1e29
        assert sgd.main(["--features", "2000", "--rows", "2000", "--steps", "150",
                         "--workers", "1", "--json"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["weight_error"] < 0.7 and err == ""
        assert default_lr("linear", BSP(), 2, averaged=True, features=2000,
                          batch=32) == pytest.approx(32 / 2033)
        assert default_lr("logistic", ASP(), 8, averaged=True, features=2000,
                          batch=32) == pytest.approx(4 * 32 / 2033 / 2)
        assert default_lr("linear", BSP(), 2, averaged=True, features=100, batch=32) == 0.1

    @pytest.mark.parametrize("flags, overlap", [([], True), (["--no-overlap"], False)])
    def test_no_overlap_makes_each_step_wait_for_its_reply(self, monkeypatch, capsys, flags,
                                                          overlap):
        seen = spy_on_start(monkeypatch, "overlap")
        assert sgd.main(["--barrier", "ssp", "--staleness", "2", "--steps", "20",
                         "--workers", "1", "--json", *flags]) == 0
        assert seen == [overlap]
        assert json.loads(capsys.readouterr().out)["weight_error"] < 0.5

    def test_checkpoint_dir_makes_the_shard_checkpoint_there(self, tmp_path, capsys):
        """So that a shard whose worker dies restarts from it (tests/param/test_elastic.py);
        before, the apps had no flag for it."""
        assert sgd.main(["--steps", "30", "--workers", "1", "--json", "--checkpoint-dir",
                         str(tmp_path), "--checkpoint-every", "10"]) == 0
        assert [p.name for p in tmp_path.iterdir()] != []
        assert json.loads(capsys.readouterr().out)["weight_error"] < 0.5
        with pytest.raises(ConfigError, match="not a directory"):
            sgd.main(["--steps", "5", "--checkpoint-dir", str(tmp_path / "none")])

    def test_resume_goes_on_from_the_checkpoint(self, tmp_path, capsys, monkeypatch):
        """A run stopped (or killed) with --checkpoint-dir goes on with --resume: its step
        and update counts carry on from the checkpoint. Before, the apps had no --resume."""
        flags = ["--workers", "1", "--json", "--checkpoint-dir", str(tmp_path)]
        with pytest.raises(CheckpointError) as missing:    # the command line's words
            sgd.main(["--steps", "30", "--resume", *flags])
        assert "run once without --resume" in missing.value.cli_message
        with pytest.raises(ConfigError, match="name its --checkpoint-dir"):
            sgd.main(["--steps", "30", "--resume", "--workers", "0"])
        with pytest.raises(ConfigError, match="--checkpoint-every needs --checkpoint-dir"):
            sgd.main(["--checkpoint-every", "5", "--workers", "0"])    # before: ignored
        with pytest.raises(ConfigError, match="it takes no --compare"):
            sgd.main(["--resume", "--compare", "bsp", "asp", *flags])
        # before: each run of the comparison moved the one before to .earlier, the user's
        # own checkpoint first, and only the last two were left
        with pytest.raises(ConfigError, match="keeps one run's checkpoint: it takes no "
                                              "--compare"):
            sgd.main(["--compare", "bsp", "asp", *flags])
        assert sgd.main(["--steps", "30", *flags]) == 0
        assert json.loads(capsys.readouterr().out)["updates"] == 30
        resumed = spy_on_start(monkeypatch, "resume")
        assert sgd.main(["--steps", "40", "--resume", *flags]) == 0
        out = json.loads(capsys.readouterr().out)
        assert resumed == [True]
        assert out["steps_per_worker"] == [40] and out["updates"] == 40
        # already past --steps: it trains nothing (before: one more step each time)
        for _ in range(2):
            assert sgd.main(["--steps", "30", "--resume", *flags]) == 0
            out = json.loads(capsys.readouterr().out)
            assert out["steps_per_worker"] == [40] and out["updates"] == 40

    def test_a_run_that_diverged_to_finite_numbers_says_so(self, capsys):
        # before: one row at lr 0.1 ended at weight error 1.5e8, loss 2.2e18 after 10 steps,
        # printed as a result with no word on stderr
        assert sgd.main(["--rows", "1", "--workers", "1", "--steps", "10", "--json"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["weight_error"] > 1
        assert "training diverged (weight error" in err and "than the zeros" in err


class HeldMonitor(sgd.Monitor):
    """``sgd.Monitor`` that stops only once the file ``flag`` exists (on the server)."""

    def __init__(self, flag: str, *args) -> None:
        super().__init__(*args)
        self.flag = flag

    def __call__(self, store) -> bool:
        return super().__call__(store) and os.path.exists(self.flag)


class TestSGDOnACluster:
    def test_two_runs_of_the_app_share_one_cluster(self, tmp_path, monkeypatch):
        """Before, every run was job 'sgd-linear': a second run on a cluster where one was
        training (two users or terminals, `--manager`) was refused as "already running"."""
        flag = tmp_path / "both-started"   # holds both runs until both have started
        monkeypatch.setattr(sgd, "Monitor", functools.partial(HeldMonitor, str(flag)))
        names = []
        start = param.Job.start

        def spy(job, *args, **kwargs):
            run = start(job, *args, **kwargs)
            names.append(job.name)
            return run
        monkeypatch.setattr(param.Job, "start", spy)
        args = sgd.build_parser().parse_args(["--steps", "30", "--features", "10", "--seed", "1"])
        with actorpy.connect(workers=2) as cluster, ThreadPoolExecutor(2) as pool:
            runs = [pool.submit(sgd.train, cluster, args, BSP()) for _ in range(2)]
            wait_until(lambda: len(names) == 2 or any(r.done() for r in runs), 60,
                       "both runs to start")
            flag.touch()
            results = [r.result(timeout=120)[0] for r in runs]
        assert [r["steps_per_worker"] for r in results] == [[30, 30], [30, 30]]
        assert len(set(names)) == 2 and all(n.startswith("sgd-linear-") for n in names)

    def test_job_names(self, tmp_path):
        parse = sgd.build_parser().parse_args
        one, two = (job_name(parse([]), "sgd-linear") for _ in range(2))
        assert one != two and re.fullmatch("sgd-linear-[0-9a-f]{6}", one)
        assert job_name(parse(["--job-name", "mine"]), "sgd-linear") == "mine"
        # a run that checkpoints keeps one name, so that --resume finds its files
        assert job_name(parse(["--checkpoint-dir", str(tmp_path)]), "sgd-linear") == "sgd-linear"
        with pytest.raises(ConfigError, match="--job-name '': name the job"):
            job_name(parse(["--job-name", ""]), "sgd-linear")

    def test_the_apps_word_the_engines_errors_with_their_flags(self):
        # the PS engine said "--timeout", "--checkpoint-dir", "--resume" and "--job-name"
        # itself, to any caller; it now says what happened and the apps word it
        late = actorpy.ActorpyTimeout("job 'j' ... timeout_s=5")
        late.job_timeout = ("j", 5.0, "")
        lost = param.JobFailed("x; pass checkpoint_dir=")
        lost.shard_lost = "server shard 0 of job 'j' was lost"
        missing = param.CheckpointError("no checkpoint at /c; run once without resume=True")
        missing.checkpoint_missing = "/c"
        taken = ConfigError("a job named 'j' is already running")
        taken.name_taken = "j"
        for exc in (late, lost, missing, taken):
            in_cli_words(exc)
        assert late.cli_message == ("job 'j' did not finish within --timeout 5 s; raise "
                                    "--timeout (or lower --steps)")
        assert lost.cli_message.endswith("was lost; pass --checkpoint-dir DIR (on every "
                                         "worker's host) to survive this")
        assert "run once without --resume (with --checkpoint-dir)" in missing.cli_message
        assert taken.cli_message.endswith("give this run its own --job-name")
        plain = param.JobFailed("all workers lost")
        in_cli_words(plain)
        assert plain.cli_message is None   # nothing to word: its own message stands

    def test_manager_run_takes_on_a_worker_that_joins(self):
        """`actorpy sgd --manager` trains on the cluster's workers and on one added while
        it runs (the app's driver hears the JOINED event and hands it a task)."""
        with actorpy.connect(workers=2) as cluster:
            proc = subprocess.Popen(
                [sys.executable, "-m", "actorpy", "sgd", "--manager",
                 cluster.local.manager_address, "--barrier", "asp", "--steps", "4000",
                 "--rows", "4000", "--features", "20", "--seed", "2", "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": ROOT})
            try:
                wait_until(lambda: any(n["role"] == "driver" and n["node_id"] != cluster.node_id
                                       for n in cluster.nodes()), 60, "the app to connect")
                [extra] = cluster.add_workers(1, timeout_s=60)
                out, err = proc.communicate(timeout=120)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
        assert proc.returncode == 0, err[-2000:]
        result = json.loads(out)
        steps = result["steps_per_worker"]
        assert len(steps) == 3 and min(steps) > 0 and result["weight_error"] < 0.05, steps
        # the joiner started at the slowest worker's step (counted, not pushed): 0 when a
        # first worker had not pushed yet (CI saw [15887, 4060, 4000] with 23947 updates)
        assert 0 <= sum(steps) - result["updates"] <= min(steps[:2]), (steps, result["updates"])


@pytest.mark.parametrize("app", ["sgd", "dnn", "p2p_sgd"])
def test_a_timeout_that_is_no_time_is_refused_by_its_flag(app, capsys):
    # before: "need a finite timeout_s > 0, got -1.0" (the API's words) once a cluster ran
    main = importlib.import_module(f"apps.{app}").main
    with pytest.raises(SystemExit) as info:
        main(["--timeout", "-1"])
    assert info.value.code == 2
    assert "argument --timeout: must be a finite number > 0" in capsys.readouterr().err

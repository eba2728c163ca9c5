"""Runs that go wrong at their edges: checkpoints that cannot be written mid-run (the
directory went away, the disk filled: training goes on, the shard says so once, and the
run's stats and end count them), and an interrupted run that cannot cancel its job."""
from __future__ import annotations

import logging
import os
import threading
from types import SimpleNamespace

import numpy as np
import pytest

import actorpy
from actorpy.barrier import BSP
from actorpy.errors import NodeLost
from engines import param
from engines.param import checkpoint
from engines.param.driver import Run
from tests.conftest import wait_until


def _push(ctx, values):
    return {"w": np.ones(100)}


def _pull(store, updates):
    w, _ = store.get("w")
    store.set("w", w + updates["w"])


def test_the_save_log_says_the_first_of_a_run_of_failures():
    saves = checkpoint.SaveLog()
    assert saves.stats() == {"checkpoint_failures": 0, "checkpoint_error": None,
                             "checkpoint_step": None}
    assert saves.written(0) == 0
    assert [saves.failed(OSError(28, "full")) for _ in range(3)] == [True, False, False]
    assert saves.written(30) == 3
    assert saves.failed(OSError(2, "gone")) is True   # a new run of failures
    assert saves.stats() == {"checkpoint_failures": 4, "checkpoint_error": "[Errno 2] gone",
                             "checkpoint_step": 30}


def test_a_checkpoint_dir_removed_mid_run_is_counted_and_said_at_the_end(tmp_path, caplog):
    # before: the shard logged one ERROR line per checkpoint (151 in this run) and the run
    # ended as if every checkpoint had been written
    folder = tmp_path / "ck"
    folder.mkdir()
    job = param.Job("ckgone", barrier=BSP(), seed=0)
    job.register_push(_push)
    job.register_pull(_pull)
    job.register_stop(lambda store: store.step >= 1500)
    with actorpy.connect(workers=2) as cluster:
        run = job.start(cluster, init={"w": np.zeros(100)}, timeout_s=120,
                        checkpoint_dir=str(folder), checkpoint_every=20)
        wait_until(lambda: os.listdir(folder), 60, "the start's checkpoint")
        os.rename(folder, tmp_path / "gone")      # at once, whatever the shard writes now
        with caplog.at_level(logging.WARNING, logger="engines.param.conductor"):
            w = run.result()["w"]
    assert np.all(w == 1500)          # training went on to the stop (BSP: a mean a round)
    shard = run.stats.shards[0]
    assert run.stats.checkpoint_failures == shard["checkpoint_failures"] > 0
    assert "does not exist" in shard["checkpoint_error"]
    assert isinstance(shard["checkpoint_step"], int)
    said = [r.getMessage() for r in caplog.records if "could not be written" in r.getMessage()]
    assert len(said) == 1 and f"{run.stats.checkpoint_failures} checkpoints" in said[0]



def test_an_interrupted_run_keeps_its_error_when_it_cannot_cancel(monkeypatch):
    # before: run.cancel()'s NodeLost (the cluster gone too) replaced the KeyboardInterrupt
    # or the run's own error (review)
    class Interrupted:
        finished = threading.Event()
        job = SimpleNamespace(name="cancel")
        cancel_and_wait = Run.cancel_and_wait     # what job.run calls on the way out

        def result(self):
            raise KeyboardInterrupt

        def done(self):
            return False

        def cancel(self):
            raise NodeLost("d-0", "this cluster was terminated")

    job = param.Job("cancel", barrier=BSP(), seed=0)
    monkeypatch.setattr(job, "start", lambda *args, **kwargs: Interrupted())
    with pytest.raises(KeyboardInterrupt):
        job.run(None, init={"w": np.zeros(2)})


def test_a_run_without_resume_keeps_an_earlier_runs_checkpoint(tmp_path, caplog):
    # before: a crashed run rerun without resume=True (`actorpy sgd --checkpoint-dir D`
    # without --resume) overwrote its checkpoint at start, without a word
    job = param.Job("rerun", barrier=BSP(), seed=0)
    job.register_push(_push)
    job.register_pull(_pull)
    job.register_stop(lambda store: store.step >= 30)
    path = checkpoint.path_for(str(tmp_path), "rerun", 0, 1)
    like = {"w": np.zeros(100)}
    with actorpy.connect(workers=2) as cluster:
        job.run(cluster, init={"w": np.zeros(100)}, timeout_s=120,
                checkpoint_dir=str(tmp_path), checkpoint_every=10)
        first = checkpoint.load(path, job="rerun", shard=0, shards=1, like=like)
        job.register_stop(lambda store: store.step >= 5)
        with caplog.at_level(logging.WARNING, logger="engines.param.driver"):
            job.run(cluster, init={"w": np.zeros(100)}, timeout_s=120,
                    checkpoint_dir=str(tmp_path), checkpoint_every=10)
    kept = checkpoint.load(path + checkpoint.EARLIER, job="rerun", shard=0, shards=1,
                           like=like)
    assert kept.base_step == first.base_step >= 30
    assert np.array_equal(kept.values["w"], first.values["w"])
    assert checkpoint.load(path, job="rerun", shard=0, shards=1, like=like).base_step < 30
    assert any("holds an earlier run's checkpoint" in r.getMessage()
               and checkpoint.EARLIER in r.getMessage() for r in caplog.records)


def test_a_run_refused_for_a_taken_name_says_nothing_of_the_running_jobs_checkpoint(
        tmp_path, caplog):
    # before: the second run warned it kept the running job's checkpoint as .earlier (it
    # did not: it was refused for the name before moving anything)
    job = param.Job("taken", barrier=BSP(), seed=0)
    job.register_push(_push)
    job.register_pull(_pull)
    job.register_stop(lambda store: False)
    path = checkpoint.path_for(str(tmp_path), "taken", 0, 1)
    with actorpy.connect(workers=2) as cluster:
        first = job.start(cluster, init={"w": np.zeros(100)}, timeout_s=120,
                          checkpoint_dir=str(tmp_path), checkpoint_every=10)
        try:
            wait_until(lambda: os.path.isfile(path), 30, "the first run's checkpoint")
            with caplog.at_level(logging.WARNING, logger="engines.param.driver"):
                with pytest.raises(actorpy.ConfigError, match="already running"):
                    job.run(cluster, init={"w": np.zeros(100)}, timeout_s=60,
                            checkpoint_dir=str(tmp_path), checkpoint_every=10)
        finally:
            first.cancel()
            with pytest.raises(param.JobFailed):
                first.result()
    assert not any("earlier run's checkpoint" in r.getMessage() for r in caplog.records)
    assert not os.path.exists(path + checkpoint.EARLIER)


def _drawing_push(ctx, values):   # step k's draw lands in slot k of w
    return {"w": np.eye(6)[ctx.step] * ctx.rng.random()}


def test_a_resumed_run_draws_on_not_its_first_batches_again(tmp_path):
    # before: its workers' rng restarted at (seed, slot): a run resumed at step 3 drew steps
    # 0-2's numbers (its batches) again
    job = param.Job("redraw", barrier=BSP(), seed=0)
    job.register_push(_drawing_push)
    job.register_pull(lambda store, updates: store.set("w", store.get("w")[0] + updates["w"]))
    job.register_stop(lambda store: store.step >= 3)
    with actorpy.connect(workers=1) as cluster:
        first = job.run(cluster, init={"w": np.zeros(6)}, timeout_s=60,
                        checkpoint_dir=str(tmp_path), checkpoint_every=1)["w"]
        job.register_stop(lambda store: store.step >= 6)
        w = job.run(cluster, init={"w": np.zeros(6)}, timeout_s=60,
                    checkpoint_dir=str(tmp_path), checkpoint_every=1, resume=True)["w"]
    assert np.array_equal(w[:3], first[:3]) and np.all(first[3:] == 0)
    assert np.all(w > 0) and not np.isin(w[3:], w[:3]).any()

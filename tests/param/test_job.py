"""The engine on a real local cluster: BSP equals single-process SGD, every barrier
converges, sharding is transparent, barrier bounds hold on the server's own table, and bad
input fails cleanly."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest

import actorpy
from actorpy.barrier import ASP, BSP, DSSP, PSP, SSP
from actorpy.errors import RemoteError
from engines import param
from engines.param import checkpoint
from tests.param import problems as pb

SEED = 11
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _job(barrier, **kw):
    job = param.Job("lin", barrier=barrier, seed=SEED, data=pb.linear_data, **kw)
    job.register_push(pb.linear_push)
    job.register_pull(pb.SGDPull(0.1))
    return job


class TestTraining:
    def test_bsp_equals_single_process_sgd(self, cluster):
        job = _job(BSP())
        job.register_stop(pb.StepStop(40))
        run = job.start(cluster, init={"w": np.zeros(pb.D)}, batch=16, timeout_s=60)
        model = run.result()
        reference = pb.reference_sgd(SEED, slots=2, steps=40, batch=16, lr=0.1)
        assert np.allclose(model["w"], reference, rtol=1e-12, atol=1e-14)
        assert run.stats.steps_per_worker == [40, 40] and run.stats.updates == 80
        assert pb.weight_error(model["w"], SEED) < 0.05

    @pytest.mark.parametrize("barrier", [SSP(staleness=2), PSP(sample=1, staleness=1), ASP(),
                                         DSSP(low=1, high=3)], ids=repr)
    def test_every_barrier_converges(self, cluster, barrier):
        job = _job(barrier)
        job.register_stop(pb.ErrorStop(SEED, 0.02))
        run = job.start(cluster, init={"w": np.zeros(pb.D)}, batch=16, timeout_s=60)
        model = run.result()
        assert pb.weight_error(model["w"], SEED) < 0.02
        steps = run.stats.steps_per_worker
        assert len(steps) == 2 and sum(steps) > 0
        if not isinstance(barrier, ASP):  # ASP holds nobody back: one worker may do it all
            assert all(s > 0 for s in steps)
        assert run.stats.statuses == {w: "FINISH" for w in run.stats.workers}

    def test_a_timeout_longer_than_a_lock_can_wait_is_no_limit(self, cluster):
        # timeout_s=1e10 failed on every worker with OverflowError (a lock waits at most
        # threading.TIMEOUT_MAX), and the driver's own wait did too
        job = _job(BSP())
        job.register_stop(pb.StepStop(5))
        model = job.run(cluster, init={"w": np.zeros(pb.D)}, batch=16, timeout_s=1e10)
        reference = pb.reference_sgd(SEED, slots=2, steps=5, batch=16, lr=0.1)
        assert np.allclose(model["w"], reference, rtol=1e-12, atol=1e-14)

    def test_two_servers_equal_one_under_bsp(self, cluster):
        models = []
        for servers in (1, 2):
            job = param.Job("split", barrier=BSP(), seed=SEED, data=pb.linear_data)
            job.register_push(pb.split_push)
            job.register_pull(pb.SGDPull(0.1))
            job.register_stop(pb.StepStop(25))
            run = job.start(cluster, init={f"w{k}": np.zeros(2) for k in range(4)},
                            servers=servers, batch=16, timeout_s=60)
            models.append(run.result())
            assert len(run.shards) == servers and len({r.node for r in run.shards}) == servers
            assert [s["pulls"] for s in run.stats.shards] == [25] * servers
        one, two = models
        for key in one:
            assert np.array_equal(one[key], two[key]), key
        reference = pb.reference_sgd(SEED, slots=2, steps=25, batch=16, lr=0.1)
        assert np.allclose(np.concatenate([one[f"w{k}"] for k in range(4)]), reference)

    def test_ssp_bound_holds_in_the_servers_table(self, cluster):
        """The schedule callback sees the server's table at every release: record the lead
        of each released worker over the slowest (slot 1 is made 20x slower)."""
        job = param.Job("ssp-table", barrier=SSP(staleness=2), seed=SEED, data=pb.linear_data)
        job.register_push(slow_slot_push)
        job.register_pull(pb.SGDPull(0.05))
        job.register_schedule(record_lead)
        job.register_stop(pb.StepStop(30))
        run = job.start(cluster, init={"w": np.zeros(pb.D), "lead": np.zeros(1)}, batch=8,
                        timeout_s=60)
        model = run.result()
        fast, slow = run.stats.steps_per_worker
        assert model["lead"][0] == 2          # the bound was reached, never passed
        assert slow >= 30 and fast <= slow + 3

    def test_balance_under_pssp_gives_the_slow_worker_a_smaller_batch(self, cluster):
        """balance=True beyond BSP: slot 1 computes each step 20 times, so its batch shrinks
        and slot 0's grows (the last batch each used is kept in the model's key "batch")."""
        job = param.Job("lb-pssp", barrier=PSP(sample=1, staleness=2), seed=SEED,
                        data=pb.linear_data)
        job.register_push(recording_slow_slot_push)
        job.register_pull(batch_pull)
        job.register_stop(pb.StepStop(60))
        run = job.start(cluster, init={"w": np.zeros(pb.D), "batch": np.zeros(2)}, batch=16,
                        balance=True, timeout_s=60)
        model = run.result()
        fast, slow = model["batch"]
        assert slow < 8 < 24 < fast, model["batch"]
        assert pb.weight_error(model["w"], SEED) < 0.1


def recording_slow_slot_push(ctx, values):
    """``slow_slot_push`` (slot 1 computes 20 times, then spins for 2 ms more: ~20 us of
    compute alone was lost in a loaded suite's noise once, the batches left at 17 and 15),
    also setting the batch it used."""
    update = slow_slot_push(ctx, values)
    busy_until = time.perf_counter() + (0.002 if ctx.slot == 1 else 0.0)
    while time.perf_counter() < busy_until:
        pass
    return {"w": update["w"], "batch": np.eye(2)[ctx.slot] * ctx.batch_size}


def batch_pull(store, updates):
    for key, update in updates.items():
        value, _ = store.get(key)
        store.set(key, value - 0.05 * update if key == "w" else np.where(update > 0, update,
                                                                          value))


def slow_slot_push(ctx, values):
    rounds = 20 if ctx.slot == 1 else 1
    for _ in range(rounds):
        update = pb.linear_push(ctx, values)
    return update


def record_lead(store, workers):
    steps = store.steps()
    lead = max(steps[w] for w in workers) - min(steps.values())
    store.set("lead", np.maximum(store.get("lead")[0], float(lead)))
    return {w: ["w"] for w in workers}


def failing_push(ctx, values):
    if ctx.slot == 1 and ctx.step == 3:
        raise ZeroDivisionError("bad batch on purpose")
    return pb.linear_push(ctx, values)


def wrong_shape_push(ctx, values):
    return {"w": np.zeros(pb.D + 1)}


def failing_barrier(me_step, view):
    raise ZeroDivisionError("no view")


def wordy_barrier(me_step, view):
    return "no"


def failing_pull(store, updates):
    raise KeyError("no such layer")


def _found_nothing(name):
    found = Future()
    found.set_result(None)
    return found


class TestBadInput:
    def _assert_clean(self, cluster, run):
        assert run.done() and run.services_stopped == [True]
        assert cluster.stop_service(run.shards[0]) is False   # nothing left to stop

    def test_push_that_raises(self, cluster):
        job = _job(BSP())
        job.register_push(failing_push)
        job.register_stop(pb.StepStop(1000))
        run = job.start(cluster, init={"w": np.zeros(pb.D)}, batch=8, timeout_s=60)
        with pytest.raises(RemoteError) as info:
            run.result()
        err = info.value
        assert err.remote_type == "ZeroDivisionError" and err.node_id in cluster.workers()
        assert "failing_push" in err.remote_traceback and "bad batch" in str(err)
        assert isinstance(err.__cause__, ZeroDivisionError)
        self._assert_clean(cluster, run)

    def test_a_push_with_a_huge_message_fails_with_it_cut(self, cluster):
        # before: the whole 3 MB came back twice in the error's text (message, traceback)
        def huge_push(ctx, values):
            raise ValueError("x" * 3_000_000 + " on purpose")
        job = _job(BSP())
        job.register_push(huge_push)
        job.register_stop(pb.StepStop(5))
        with pytest.raises(RemoteError) as info:
            job.run(cluster, init={"w": np.zeros(pb.D)}, timeout_s=60)
        assert info.value.remote_message.endswith("x on purpose")
        assert "characters cut" in info.value.remote_message and len(str(info.value)) < 20_000

    def test_a_push_that_cannot_be_pickled_fails_the_run_at_once(self, cluster):
        # before: taken for a worker that died while it got its task, so the run waited out
        # its timeout_s and said only that the stop condition was not reached
        lock = threading.Lock()
        job = _job(ASP())
        job.register_push(lambda ctx, values: (lock, {"w": values["w"]})[1])
        job.register_stop(pb.StepStop(10))
        run = job.start(cluster, init={"w": np.ones(pb.D)}, timeout_s=60)
        with pytest.raises(actorpy.SerializationError, match=r"\.push -> captured variable "
                                                             r"'lock' -> _thread\.lock object"):
            run.result(timeout_s=20)
        assert time.monotonic() - run.t0 < 20
        self._assert_clean(cluster, run)

    def test_a_push_that_returns_none_is_a_clear_error(self, cluster):
        # before: None was taken as no update, so a push missing its `return` trained
        # nothing and the run ended as if it had worked
        job = _job(BSP())
        job.register_push(lambda ctx, values: None)
        job.register_stop(pb.StepStop(3))
        run = job.start(cluster, init={"w": np.ones(pb.D)}, timeout_s=60)
        with pytest.raises(RemoteError, match=r"TypeError: push on worker w-\w+ returned None; "
                                              r"return a dict of key -> update, or \{\} for "
                                              "no update this step") as info:
            run.result()
        assert info.value.node_id in cluster.workers()
        assert info.value.node_id in info.value.remote_message
        self._assert_clean(cluster, run)

    @pytest.mark.parametrize("servers", [1, 2])
    def test_a_push_that_returns_no_dict_is_a_clear_error(self, cluster, servers):
        # before, with servers=2: "'list' object has no attribute 'items'" from the worker's
        # split by shard; a generator failed to pickle under either
        job = _job(ASP())
        job.register_stop(pb.StepStop(3))
        for push, name in ((lambda ctx, values: [1], "list"),
                           (lambda ctx, values: (x for x in "w"), "generator")):
            job.register_push(push)
            with pytest.raises(RemoteError, match=rf"UpdateError: push on worker w-\w+ "
                                                  rf"returned {name}; it must return a dict"):
                job.run(cluster, init={"w": np.ones(pb.D), "b": np.ones(1)}, servers=servers,
                        timeout_s=60)

    def test_a_push_that_returns_an_empty_dict_is_a_step_without_update(self, cluster):
        job = _job(BSP())
        job.register_push(lambda ctx, values: {})
        job.register_stop(pb.StepStop(3))
        run = job.start(cluster, init={"w": np.ones(pb.D)}, timeout_s=60)
        assert np.array_equal(run.result()["w"], np.ones(pb.D))
        assert run.stats.steps_per_worker == [3, 3] and run.stats.updates == 0

    def test_update_of_the_wrong_shape(self, cluster):
        job = _job(BSP())
        job.register_push(wrong_shape_push)
        job.register_stop(pb.StepStop(10))
        run = job.start(cluster, init={"w": np.ones(pb.D)}, timeout_s=60)
        with pytest.raises(RemoteError) as info:
            run.result()
        message = str(info.value)
        assert info.value.remote_type == "engines.param.errors.UpdateError"
        assert "key 'w'" in message and f"({pb.D + 1},)" in message and f"({pb.D},)" in message
        assert info.value.node_id in cluster.workers()
        assert np.array_equal(run.model["w"], np.ones(pb.D))   # untouched
        self._assert_clean(cluster, run)

    def test_pull_that_raises(self, cluster):
        job = _job(ASP())
        job.register_pull(failing_pull)
        job.register_stop(pb.StepStop(10))
        run = job.start(cluster, init={"w": np.ones(pb.D)}, timeout_s=60)
        with pytest.raises(RemoteError, match="pull raised KeyError.*no such layer.*shard 0"):
            run.result()
        assert np.array_equal(run.model["w"], np.ones(pb.D))
        self._assert_clean(cluster, run)

    @pytest.mark.parametrize("barrier, said, where", [
        # before: a bare "ZeroDivisionError: division by zero", naming neither the callback
        # nor the worker
        (failing_barrier, r"barrier raised ZeroDivisionError: no view on server shard 0, "
                          r"deciding for worker w-", "failing_barrier"),
        # before: bool("no") is True, so "no" let every worker go
        (wordy_barrier, r"barrier raised TypeError: barrier returned a str; it must return a "
                        r"Decision, True \(advance\) or False \(wait\) on server shard 0",
         "as_decision"),
    ], ids=["raises", "answers-a-string"])
    def test_a_barrier_that_fails_is_a_clear_error(self, cluster, barrier, said, where):
        job = _job(BSP())
        job.register_barrier(barrier)
        job.register_stop(pb.StepStop(10))
        run = job.start(cluster, init={"w": np.ones(pb.D)}, timeout_s=60)
        with pytest.raises(RemoteError, match=said) as info:
            run.result()
        assert info.value.remote_type == "engines.param.errors.CallbackError"
        assert where in info.value.remote_traceback
        self._assert_clean(cluster, run)

    def test_a_second_run_of_a_running_job_is_refused_in_plain_words(self, cluster):
        # before: ServiceError "the service name 'lin/shard0' is taken ...; stop that service
        # first, or choose another name" (a second `actorpy sgd --manager` on one cluster)
        job = _job(ASP())
        job.register_stop(pb.StepStop(10**9))
        first = job.start(cluster, init={"w": np.zeros(pb.D)}, timeout_s=60)
        try:
            with pytest.raises(actorpy.ConfigError, match="a job named 'lin' is already "
                                                          "running on this cluster"):
                job.run(cluster, init={"w": np.zeros(pb.D)}, timeout_s=60)
        finally:
            first.cancel()
            with pytest.raises(param.JobFailed):
                first.result()
        self._assert_clean(cluster, first)

    def test_a_run_started_since_the_name_check_is_refused_in_the_same_words(self, cluster,
                                                                              monkeypatch):
        # two runs checking at once both find no 'lin/shard0'; the second's shard then failed
        # with the name service's "stop that service first, or choose another name"
        job = _job(ASP())
        job.register_stop(pb.StepStop(10**9))
        first = job.start(cluster, init={"w": np.zeros(pb.D)}, timeout_s=60)
        try:
            monkeypatch.setattr(cluster, "lookup_async", _found_nothing)
            with pytest.raises(actorpy.ConfigError, match="a job named 'lin' is already "
                                                          "running on this cluster") as info:
                job.run(cluster, init={"w": np.zeros(pb.D)}, timeout_s=60)
            assert info.value.name_taken == "lin"   # the apps word it (in_cli_words)
        finally:
            monkeypatch.undo()
            first.cancel()
            with pytest.raises(param.JobFailed):
                first.result()
        self._assert_clean(cluster, first)

    @pytest.mark.parametrize("wait", ["job.run(c, ", "job.start(c, "])
    def test_a_run_interrupted_by_ctrl_c_stops_its_job(self, wait):
        """A notebook's interrupt: the job went on without its driver until timeout_s,
        holding the workers and its name, so running the cell again was refused (through
        job.start(...).result() too, until Run.result cancelled it as job.run does)."""
        then = "" if wait.startswith("job.run") else ".result()"
        script = (
            "import os, signal, threading, numpy as np, actorpy\n"
            "from actorpy.barrier import BSP\n"
            "from engines import param\n"
            "from tests.param import problems as pb\n"
            "job = param.Job('lin', barrier=BSP(), seed=1, data=pb.linear_data)\n"
            "job.register_push(pb.linear_push)\n"
            "job.register_pull(pb.SGDPull(0.1))\n"
            "job.register_stop(pb.StepStop(10**9))\n"
            "with actorpy.connect(workers=2) as c:\n"
            "    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
            "    try:\n"
            f"        {wait}init={{'w': np.zeros(pb.D)}}, timeout_s=120){then}\n"
            "    except KeyboardInterrupt:\n"
            "        print('interrupted', flush=True)\n"
            "    job.register_stop(pb.StepStop(3))\n"
            "    run = job.start(c, init={'w': np.zeros(pb.D)}, timeout_s=120)\n"
            "    run.result()\n"
            "    print('again', run.stats.steps_per_worker, flush=True)\n")
        out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == ["interrupted", "again [3, 3]"], out.stderr

    @pytest.mark.parametrize("answer, said", [
        (None, "None on server shard 0"),   # before: false, so it ran until timeout_s
        ("no", r"a str; it must return True \(stop\) or False \(go on\) \(on server shard 0"),
        (np.zeros(2), "a float64 array of shape \\(2,\\)")])  # before: "true" / numpy's error
    def test_a_stop_that_returns_no_yes_or_no_is_a_clear_error(self, cluster, answer, said):
        job = _job(ASP())
        job.register_stop(lambda store: answer)
        run = job.start(cluster, init={"w": np.ones(pb.D)}, timeout_s=60)
        with pytest.raises(RemoteError, match=f"stop returned {said}"):
            run.result()
        self._assert_clean(cluster, run)

    def test_a_pull_that_hangs_ends_the_job_soon_after_its_timeout(self):
        """A shard's pull that never returns: the job failed at timeout_s=4 only after 49 s
        (15 s waiting for the worker tasks, 30 s for the hung shard's model, up to 10 s to
        stop it); a failed job now waits 2 s for each (its own cluster: the hung thread is
        the shard's)."""
        import threading
        import time

        from actorpy.errors import ActorpyTimeout

        def hanging_pull(store, updates):
            w, clock = store.get("w")
            if clock == 5:
                threading.Event().wait(30)
            store.set("w", w - 0.1 * updates["w"])

        job = _job(ASP())
        job.register_pull(hanging_pull)
        job.register_stop(pb.StepStop(1000))
        with actorpy.connect(workers=2) as cluster:
            started = time.monotonic()
            with pytest.raises(ActorpyTimeout, match="within timeout_s=4"):
                job.run(cluster, init={"w": np.ones(pb.D)}, timeout_s=4)
            assert time.monotonic() - started < 4 + 10

    def test_a_timeout_says_where_the_workers_are(self):
        # before: "did not reach its stop condition ...; check the stop function", when a
        # worker's data= never returned
        def slow_data(ctx):
            if ctx.slot == 1:
                threading.Event().wait(12)   # does not return within timeout_s (the scenario)
            return pb.linear_data(ctx)

        job = param.Job("lin", barrier=ASP(), seed=SEED, data=slow_data)
        job.register_push(pb.linear_push)
        job.register_pull(pb.SGDPull(0.1))
        job.register_stop(pb.StepStop(10**9))
        with actorpy.connect(workers=2) as cluster:
            with pytest.raises(actorpy.ActorpyTimeout,
                               # the other worker's task may have ended on its own deadline
                               match=r"within timeout_s=3 \(steps completed: (w-\w+ [0-]+, )?"
                                     r"w-\w+ [0-]+; w-\w+ has not joined: its data= has not "
                                     r"returned \(or its task waits for a task slot another "
                                     r"job's task holds on that worker\), and the first step "
                                     r"waits") as info:
                job.run(cluster, init={"w": np.ones(pb.D)}, timeout_s=3)
        assert "py-spy dump" in str(info.value)

    def test_a_job_after_one_whose_push_outlived_it_says_the_workers_are_busy(self):
        """A push that outlived its job's timeout_s keeps its worker's one task thread: the
        next job's tasks waited behind it, and that job timed out saying "check the stop
        function" (its own cluster: the workers stay busy for a while)."""
        def slow_push(ctx, values):
            threading.Event().wait(8)   # outlives timeout_s=1 (the scenario, not a wait)
            return {"w": np.zeros(pb.D)}

        slow, fast = _job(ASP()), _job(ASP())
        slow.register_push(slow_push)
        for job in (slow, fast):
            job.register_stop(pb.StepStop(3))
        with actorpy.connect(workers=2) as cluster:
            with pytest.raises(actorpy.ActorpyTimeout, match="within timeout_s=1"):
                slow.run(cluster, init={"w": np.ones(pb.D)}, timeout_s=1)
            started = time.monotonic()
            with pytest.raises(param.JobFailed, match=r"still run a task of a job that ended "
                                                      r"without it: its push or data outlived"):
                fast.run(cluster, init={"w": np.ones(pb.D)}, timeout_s=20)
            assert time.monotonic() - started < 5

    def test_a_checkpoint_dir_it_cannot_write_is_refused_at_start(self, cluster, tmp_path):
        # Before, the shard logged an ERROR at every save and the run went on with none.
        os.mkdir(checkpoint.path_for(str(tmp_path), "lin", 0, 1))   # nothing replaces a dir
        job = _job(BSP())
        job.register_stop(pb.StepStop(2))
        with pytest.raises(actorpy.ConfigError, match=r"shard 0 cannot write .*lin\.shard0of1"):
            job.run(cluster, init={"w": np.zeros(pb.D)}, checkpoint_dir=str(tmp_path),
                    timeout_s=30)
        assert os.listdir(tmp_path) == ["lin.shard0of1.npz"]   # no temporary file left

    def test_a_checkpoint_dir_it_cannot_write_is_refused_on_resume_too(self, cluster, tmp_path):
        # Before, a resumed shard read its checkpoint, then logged an ERROR at every save and
        # trained with none.
        job = _job(BSP())
        job.register_stop(pb.StepStop(2))
        job.run(cluster, init={"w": np.zeros(pb.D)}, checkpoint_dir=str(tmp_path), timeout_s=30)
        path = checkpoint.path_for(str(tmp_path), "lin", 0, 1)
        saved = open(path, "rb").read()
        # root writes through any mode bits (tests may run as root): what stops a save here
        # is a directory where each process would put its temporary file.
        for pid in cluster.local.pids():
            os.mkdir(f"{os.path.dirname(path)}/.{os.path.basename(path)}.{pid}.tmp")
        job.register_stop(pb.StepStop(4))
        words = re.escape(f"checkpoint_dir '{tmp_path}': shard 0 cannot write {path}")
        with pytest.raises(actorpy.ConfigError, match=words):
            job.run(cluster, init={"w": np.zeros(pb.D)}, checkpoint_dir=str(tmp_path),
                    resume=True, timeout_s=30)
        assert open(path, "rb").read() == saved

    def test_a_checkpoint_dir_or_every_that_means_nothing_is_refused(self, cluster, tmp_path,
                                                                     monkeypatch):
        # "" was the current directory (checkpoints landed there without a word), NaN pulls
        # between checkpoints never came, 5 failed in os.path as a TypeError
        monkeypatch.chdir(tmp_path)
        job = _job(BSP())
        job.register_stop(pb.StepStop(2))
        for bad in ("", 5):
            with pytest.raises(actorpy.ConfigError, match="checkpoint_dir must name a directory"):
                job.run(cluster, init={"w": np.zeros(pb.D)}, checkpoint_dir=bad, timeout_s=30)
        for every in (float("nan"), 2.5, -1):
            with pytest.raises(actorpy.ConfigError, match="an int checkpoint_every >= 0"):
                job.run(cluster, init={"w": np.zeros(pb.D)}, checkpoint_dir=str(tmp_path),
                        checkpoint_every=every, timeout_s=30)
        assert os.listdir(tmp_path) == []

"""How a run that cannot go on ends, on a real local cluster: a custom barrier that holds
every worker, and the statuses a failed, timed-out or cancelled run reports."""
from __future__ import annotations

import time

import numpy as np
import pytest

from actorpy.errors import ActorpyTimeout, RemoteError
from engines import param
from tests.conftest import wait_until
from tests.param import problems as pb

HOLDS_ALL = r"the barrier holds every worker \(w-\w+ at step 0, w-\w+ at step 0\) and none is "


def _job(name, barrier=None):
    job = param.Job(name, seed=3, data=pb.linear_data)
    job.register_push(pb.linear_push)
    job.register_pull(pb.SGDPull(0.1))
    job.register_stop(pb.StepStop(10))
    if barrier is not None:
        job.register_barrier(barrier)
    return job


def off_by_one(me_step, view):   # BSP written with < for <=: it lets nobody go
    return all(me_step < s for s in view.steps().values())


class TestABarrierThatHoldsEveryWorker:
    def test_fails_at_once_naming_the_barrier_when_no_worker_can_join(self, cluster):
        # before: it waited out timeout_s and blamed stop, push, pull or data=
        job = _job("held-fixed", off_by_one)
        t0 = time.monotonic()
        run = job.start(cluster, init={"w": np.zeros(pb.D)}, timeout_s=60,
                        workers=cluster.workers())
        with pytest.raises(RemoteError, match=HOLDS_ALL + r"computing: nothing can release "
                                                          r"them; register_barrier's off_by_one"
                           ) as info:
            run.result()
        assert time.monotonic() - t0 < 15
        assert info.value.remote_type == "engines.param.errors.CallbackError"
        assert set(run.stats.statuses.values()) == {"FAILED"}

    def test_elastic_the_timeout_names_the_barrier(self, cluster):
        # workers may join (and a barrier may wait for them): it waits, but says why
        run = _job("held-elastic", off_by_one).start(cluster, init={"w": np.zeros(pb.D)},
                                                     timeout_s=4)
        with pytest.raises(ActorpyTimeout, match=r"within timeout_s=4 .*: " + HOLDS_ALL):
            run.result()
        assert "stop function" not in str(run.failure)
        assert "FINISH" not in run.stats.statuses.values()


def test_workers_halted_by_a_cancel_are_not_said_to_have_finished(cluster):
    # before: "FINISH", as if they had reached the stop condition
    job = _job("halted")
    job.register_stop(pb.StepStop(10**9))
    run = job.start(cluster, init={"w": np.zeros(pb.D)}, timeout_s=60)
    wait_until(lambda: len(run.shard_stats()[0]["steps"]) == 2 and run.shard_stats()[0]["step"]
               >= 5, 30, "both workers at work")
    run.cancel()
    with pytest.raises(param.JobFailed, match="cancelled"):
        run.result()
    assert run.stats.statuses == {w: "HALTED" for w in run.stats.workers}

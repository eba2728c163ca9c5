"""``server_nodes=``: server shards on workers that do not train. Training is the same as
with the shard on a training worker (BSP bit for bit), the server nodes get no worker task,
bad placements are refused, and a server node SIGKILLed is handled as any shard host is
(restarted from its checkpoint, preferably on a worker that neither trains nor hosts; without
a checkpoint the job fails clearly)."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import actorpy
from actorpy.barrier import BSP
from engines import param
from tests.conftest import wait_until
from tests.param import problems as pb

SEED = 13


def _job(name, lr=0.1):
    job = param.Job(name, barrier=BSP(), seed=SEED, data=pb.linear_data)
    job.register_push(pb.linear_push)
    job.register_pull(pb.SGDPull(lr))
    return job


def _pid(cluster, node):
    return {r["node_id"]: r["pid"] for r in cluster.nodes()}[node]


def _pulls(run):
    return run.shard_stats()[0]["pulls"]


@pytest.fixture(scope="module")
def cluster():
    with actorpy.connect(workers=3) as c:
        yield c


class TestServerNodes:
    def test_bsp_on_a_server_node_equals_single_process_sgd(self, cluster):
        *trainers, server = cluster.workers()
        job = _job("placed")
        job.register_stop(pb.StepStop(40))
        run = job.start(cluster, init={"w": np.zeros(pb.D)}, batch=16, timeout_s=60,
                        server_nodes=[server])
        model = run.result()
        assert [ref.node for ref in run.shards] == [server]
        assert run.stats.workers == trainers          # the server node got no task
        assert run.stats.steps_per_worker == [40, 40] and run.stats.updates == 80
        reference = pb.reference_sgd(SEED, slots=2, steps=40, batch=16, lr=0.1)
        assert np.allclose(model["w"], reference, rtol=1e-12, atol=1e-14)

    def test_two_shards_on_one_server_node(self, cluster):
        *trainers, server = cluster.workers()
        job = param.Job("placed2", barrier=BSP(), seed=SEED, data=pb.linear_data)
        job.register_push(pb.split_push)
        job.register_pull(pb.SGDPull(0.1))
        job.register_stop(pb.StepStop(25))
        run = job.start(cluster, init={f"w{k}": np.zeros(2) for k in range(4)}, servers=2,
                        batch=16, timeout_s=60, workers=trainers, server_nodes=[server])
        model = run.result()
        assert [ref.node for ref in run.shards] == [server, server]
        assert [s["pulls"] for s in run.stats.shards] == [25, 25]
        reference = pb.reference_sgd(SEED, slots=2, steps=25, batch=16, lr=0.1)
        assert np.allclose(np.concatenate([model[f"w{k}"] for k in range(4)]), reference)

    def test_bad_placements_are_refused(self, cluster):
        a, b, c = cluster.workers()
        job = _job("refused")
        job.register_stop(pb.StepStop(1))
        init = {"w": np.zeros(pb.D)}
        with pytest.raises(actorpy.ConfigError, match="must name live workers"):
            job.run(cluster, init=init, server_nodes=["no-such-node"])
        with pytest.raises(actorpy.ConfigError, match="must name live workers"):
            job.run(cluster, init=init, server_nodes=[])
        with pytest.raises(actorpy.ConfigError, match="leave it out of workers="):
            job.run(cluster, init=init, workers=[a, b], server_nodes=[b])
        with pytest.raises(actorpy.ConfigError, match="no live workers to train on besides"):
            job.run(cluster, init=init, server_nodes=[a, b, c])
        # nothing was left behind: the same job (its shard and conductor names) runs now
        assert job.run(cluster, init=init, server_nodes=[c], timeout_s=30)["w"].shape == (pb.D,)


class TestServerNodeLost:
    def test_server_node_killed_shard_restarts_on_an_idle_worker(self, tmp_path):
        with actorpy.connect(workers=4, dead_after_s=1.0) as cluster:
            a, b, server, idle = cluster.workers()
            job = _job("server-lost", lr=0.05)
            job.register_stop(pb.SlowErrorStop(SEED, 0.01, min_step=300))
            run = job.start(cluster, init={"w": np.zeros(pb.D)}, batch=16, timeout_s=60,
                            workers=[a, b], server_nodes=[server],
                            checkpoint_dir=str(tmp_path), checkpoint_every=10)
            wait_until(lambda: _pulls(run) >= 30, 30, "30 BSP rounds")
            os.kill(_pid(cluster, server), signal.SIGKILL)
            model = run.result()
            assert run.stats.restarts == 1 and run.shards[0].node == idle
            assert pb.weight_error(model["w"], SEED) < 0.01
            assert run.stats.workers == [a, b]
            assert run.stats.statuses == {a: "FINISH", b: "FINISH"}

    def test_server_node_lost_without_checkpoint_fails_clearly(self):
        with actorpy.connect(workers=3, dead_after_s=1.0) as cluster:
            server = cluster.workers()[2]
            job = _job("server-nockpt")
            job.register_stop(pb.StepStop(10**9))
            run = job.start(cluster, init={"w": np.zeros(pb.D)}, timeout_s=60,
                            server_nodes=[server])
            wait_until(lambda: _pulls(run) >= 5, 30, "training to start")
            os.kill(_pid(cluster, server), signal.SIGKILL)
            with pytest.raises(param.JobFailed, match="pass checkpoint_dir="):
                run.result()

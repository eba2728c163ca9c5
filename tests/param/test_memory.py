"""How much memory a server shard's process takes for a large model: about the model, one
update and the new value (3x) with one worker; with n workers under BSP the round's n
updates and their mean besides the model (n + 2). Before, the start request (the init
values' frames) was held as long as the shard ran, a push's received frames as long as its
handler ran, the buffered updates while pull made the new value, and the mean built one
model-sized product per update: 5x with one worker, 7x with two.

The peak is the shard process's VmHWM after the job less its VmRSS before (the shard alone
on a server node; a small job first, so that what the engine imports is already there).
Without ``overlap``, so that no worker's next push arrives while a round is folded. The
cluster's chunk size is small, so each value travels as several frames, as one over 64 MB
does on a default cluster."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import actorpy
from actorpy.barrier import BSP, weighted_average
from engines import param
from engines.param.aggregate import combine

MB = 1 << 20
FLOATS = 12 * MB   # a 96 MB float64 model (every array over 32 MB: malloc maps and unmaps it)
CHUNK = 48 * MB

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _push(ctx, values):
    return {"a": np.full_like(values["a"], 1.0)}


def _pull(store, updates):
    value, _ = store.get("a")
    store.set("a", value + updates["a"])


def _job(name, steps):
    job = param.Job(name, barrier=BSP(), seed=0)
    job.register_push(_push)
    job.register_pull(_pull)
    job.register_stop(lambda store: store.step >= steps)
    return job


def _status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.fixture(scope="module")
def cluster():
    with actorpy.connect(workers=3, chunk_bytes=CHUNK) as c:
        yield c


def _shard_peak(cluster, trainers, steps):
    """The shard process's peak above its memory before, in model sizes, and the model."""
    *workers, server = cluster.workers()
    pid = {r["node_id"]: r["pid"] for r in cluster.nodes()}[server]
    warm = _job(f"warm{trainers}", 1).start(cluster, init={"a": np.zeros(1000)}, timeout_s=60,
                                            workers=workers[:trainers], server_nodes=[server])
    warm.result()
    init = {"a": np.zeros(FLOATS)}
    before = _status(pid, "VmRSS")
    run = _job(f"big{trainers}", steps).start(cluster, init=init, timeout_s=120,
                                              workers=workers[:trainers],
                                              server_nodes=[server], overlap=False)
    model = run.result()
    peak = _status(pid, "VmHWM")
    assert np.array_equal(model["a"][:3], [steps] * 3)   # each round adds the mean, 1
    return (peak - before) / init["a"].nbytes


def test_one_worker_shard_holds_model_update_and_new_value(cluster):
    # the model, the update received, the new value pull makes; before: 5.0
    assert _shard_peak(cluster, trainers=1, steps=2) < 3.5


def test_two_workers_shard_holds_model_the_rounds_updates_and_their_mean(cluster):
    # the model, two updates, their mean (pull's new value comes once they are let go of);
    # before: 7.0
    assert _shard_peak(cluster, trainers=2, steps=2) < 4.5


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_large_mean_is_bit_for_bit_the_weighted_average(dtype):
    # a large key's mean is accumulated block by block (no model-sized product per update):
    # the same operations on each element as weighted_average's, so the same bits
    rng = np.random.default_rng(0)
    updates = [rng.standard_normal(300_001).astype(dtype) for _ in range(3)]
    batches = [256, 100, 7]
    pending = [(slot, f"w{slot}", {"a": u}, b, ()) for slot, (u, b)
               in enumerate(zip(updates, batches))]
    mean = combine(pending, "mean")["a"]
    assert mean.dtype == dtype
    assert np.array_equal(mean, weighted_average(updates, batches))

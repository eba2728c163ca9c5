"""A shard whose inbox is full refuses a push (ServiceOverloaded); the worker sends it again
after a pause instead of failing the job (large updates from several workers at once)."""
from __future__ import annotations

import numpy as np

import actorpy
from actorpy.barrier import ASP
from engines import param

SIZE = 50_000          # 400 KB of float64 per update: two fill a 1 MB inbox


def _push(ctx, values):
    return {"w": np.ones(SIZE)}


def _pull(store, updates):
    a = np.random.default_rng(0).standard_normal((150, 150))   # a few ms: pushes queue up
    np.linalg.inv(a @ a.T + np.eye(150))
    w, _ = store.get("w")
    store.set("w", w + updates["w"])


def test_a_push_refused_by_a_full_inbox_is_sent_again():
    # before: the worker's task failed with ServiceOverloaded and the job with it
    job = param.Job("overload", barrier=ASP(), seed=0)
    job.register_push(_push)
    job.register_pull(_pull)
    job.register_stop(lambda store: store.step >= 60)
    with actorpy.connect(workers=3, service_inbox_bytes=1 << 20) as cluster:
        run = job.start(cluster, init={"w": np.zeros(SIZE)}, timeout_s=120)
        w = run.result()["w"]
        updates = run.stats.updates
    # every update applied once, none lost or doubled by the retries: one a step counted
    assert updates >= 60 and np.all(w == updates)
    assert updates == sum(run.stats.steps_per_worker)

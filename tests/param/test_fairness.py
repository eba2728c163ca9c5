"""A worker beside its shard must not keep a remote worker's pushes waiting: under ASP with
an empty push the co-located worker's requests are answered on its own thread, and it
never waits for anything."""
from __future__ import annotations

import numpy as np

import actorpy
from actorpy.barrier import ASP
from engines import param

STEPS = 20   # the run ends once every worker has done this many


def _push(ctx, values):
    return {k: np.ones_like(v) for k, v in values.items()}


def _pull(store, updates):
    for key, update in updates.items():
        w, _ = store.get(key)
        store.set(key, w + update)


def test_a_remote_worker_keeps_pace_beside_a_busy_co_located_one():
    # before: the node's I/O thread, back from its poll with the remote worker's push,
    # could not get the interpreter lock back from the co-located worker, which lets go of
    # it in every step and takes it back at once. It came and went with the machine's
    # load: in half of six batches of 20 runs, 2-10 runs went over 100x (up to 2 370x: the
    # remote worker's 20 steps took 9.4 s), none in the others. Now the co-located worker
    # hands the I/O thread a round when it has gone 2 ms without one (SocketLoop.let_run):
    # none over 100x in 140 runs (at most 84x, 0.29 s), so 200x leaves a margin. This
    # fails on the old code only when that mode shows; test_requests.py checks let_run.
    job = param.Job("fairness", barrier=ASP(), seed=0)
    job.register_push(_push)
    job.register_pull(_pull)
    job.register_stop(lambda store: store.step >= STEPS)
    ratios = []
    with actorpy.connect(workers=2) as cluster:
        for _ in range(12):
            run = job.start(cluster, init={"p": np.zeros(3), "q": np.zeros((2, 2))},
                            timeout_s=120)
            run.result()
            steps = run.stats.steps_per_worker
            assert len(steps) == 2 and min(steps) >= STEPS
            ratios.append(round(max(steps) / min(steps), 1))
    assert max(ratios) <= 200, sorted(ratios)

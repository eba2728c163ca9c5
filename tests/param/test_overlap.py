"""A worker that computes its next step while its push travels (``run(overlap=True)``, the
default under a barrier with staleness): each step reads values missing at most its own
last update, and the barrier's bound holds for the steps computed ahead too (the server
releases a worker once it may begin the step after next)."""
from __future__ import annotations

import numpy as np
import pytest

from actorpy.barrier import ASP, BSP, PSP, SSP
from engines import param
from engines.param.job import overlaps
from tests.param import problems as pb

SEED = 5
STALENESS = 2


def watching_push(ctx, values):
    """A gradient step that also reports, as updates of its own keys, how many of its own
    updates and how many of the other worker's the values it read had folded in; slot 1 is
    slow (it computes its gradient 40 times)."""
    counts = values["count"]
    me = ctx.slot
    seen = np.zeros((2, 2))
    seen[me] = (ctx.step - counts[me], ctx.step - counts[1 - me])   # own missing, lead
    for _ in range(40 if me == 1 else 1):
        update = pb.linear_push(ctx, values)
    one = np.zeros(2)
    one[me] = 1.0
    return {**update, "count": one, "seen": seen}


def watching_pull(store, updates):
    for key, update in updates.items():
        value, _ = store.get(key)
        if key == "w":
            store.set(key, value - 0.05 * update)
        elif key == "count":
            store.set(key, value + update)
        else:                                   # the most each worker ever saw
            store.set(key, np.maximum(value, update))


def _watch(cluster, barrier, overlap, servers=1):
    job = param.Job("overlap", barrier=barrier, seed=SEED, data=pb.linear_data,
                    aggregate="each")
    job.register_push(watching_push)
    job.register_pull(watching_pull)
    job.register_stop(pb.StepStop(60))
    model = job.run(cluster, init={"w": np.zeros(pb.D), "count": np.zeros(2),
                                   "seen": np.full((2, 2), -99.0)},
                    batch=8, timeout_s=60, overlap=overlap, servers=servers)
    return model["seen"]


@pytest.mark.parametrize("barrier, servers", [(SSP(STALENESS), 1), (PSP(1, STALENESS), 1),
                                             (SSP(STALENESS), 2)],
                         ids=["ssp", "pssp", "ssp-2-shards"])
def test_a_step_computed_ahead_misses_only_its_own_last_update(cluster, barrier, servers):
    seen = _watch(cluster, barrier, overlap=True, servers=servers)
    own_missing, lead = seen[:, 0], seen[:, 1]
    assert own_missing.tolist() == [1.0, 1.0]    # each computed a step ahead, never two
    # no step began more than the staleness ahead of what it read of the other worker,
    # and the fast one was held there (without the server's lookahead it went one further)
    assert lead.max() == STALENESS, seen


def test_without_overlap_each_step_reads_its_own_last_update(cluster):
    seen = _watch(cluster, SSP(STALENESS), overlap=False)
    assert seen[:, 0].tolist() == [0.0, 0.0]
    assert seen[:, 1].max() == STALENESS, seen


def test_overlap_where_it_keeps_the_jobs_meaning():
    assert [overlaps(p, None) for p in (ASP(), SSP(2), PSP(1, 1), BSP(), SSP(0), PSP(2, 0))] \
        == [True, True, True, False, False, False]
    # a schedule names the keys of each next step: a step computed ahead would use the last
    assert not overlaps(SSP(2), lambda store, workers: {w: ["w"] for w in workers})

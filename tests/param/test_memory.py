"""What a worker holds while it waits: not the last reply's values (with a large model, a
whole model's worth of memory in the worker's process, and in the shard's beside it)."""
from __future__ import annotations

import weakref

import numpy as np
import pytest

from actorpy.barrier import BSP, SSP
from engines import param

#: weak references to the values each push was given, in this process (the callbacks
#: below are pickled by reference, so a worker's push and its shard's pull share them)
_GIVEN: list[weakref.ref] = []


def _push(ctx, values):
    _GIVEN.append(weakref.ref(values["w"]))
    return {"w": np.ones_like(values["w"])}


def _pull(store, updates):
    # on the shard's node, while the worker beside it waits for this round's reply: how
    # many of the values its pushes were given are still held (the latest apart: under
    # overlap the next step may be computing on it)
    store.record(held=sum(ref() is not None for ref in _GIVEN[:-1]),
                 latest=_GIVEN[-1]() is not None, given=len(_GIVEN))
    w, _ = store.get("w")
    store.set("w", w + updates["w"])


@pytest.mark.parametrize("name, barrier, overlap", [("bsp", BSP(), False),
                                                     ("ssp-overlap", SSP(2), True)])
def test_a_waiting_worker_holds_no_earlier_reply(cluster, name, barrier, overlap):
    # before: the worker loop kept the last reply (its raw tuple and its values) bound
    # while it waited for the next one: with a 190 MB model the shard's process beside a
    # worker peaked at 1 766 MB, 1 568 MB now, and a remote worker at 804 MB, 614 MB now
    job = param.Job(f"held-{name}", barrier=barrier, seed=0)
    job.register_push(_push)
    job.register_pull(_pull)
    job.register_stop(lambda store: store.step >= 8)
    shard_host = cluster.workers()[0]
    run = job.start(cluster, init={"w": np.zeros(1000)}, workers=[shard_host], timeout_s=60)
    run.result()
    rows = [row for row in run.stats.trace if row["given"] >= 3]
    assert rows, run.stats.trace
    assert max(row["held"] for row in rows) == 0, rows
    if not overlap:   # the step just pushed is not computing: its values are let go of too
        assert max(row["latest"] for row in rows) == 0, rows

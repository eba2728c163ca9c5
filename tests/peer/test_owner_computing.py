"""A peer answers other peers' pushes while its own ``push`` runs: a straggler that owns a
key does not hold up every peer pushing to it (``ServiceContext.unlocked``), nor look dead
to them. Real processes: 2 peers on an embedded cluster of 2 workers, ASP, one key: a small
one, and one over ``QUICK_MODEL_BYTES`` (its messages are handled on the I/O thread only
while ``push`` runs: ``Service.aside_kinds``)."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import actorpy
from actorpy.barrier import ASP
from actorpy.values import QUICK_MODEL_BYTES
from engines import peer

STEPS = 40
HOLD_S = 10.0   # how long a peer's push waits for the other peer to get on
#: peer -> (its step whose push waits, the other peer's step it waits for)
HOLDS = {0: (3, 13), 1: (20, 30)}


def _read_step(folder: Path, index: int) -> int:
    try:
        return int((folder / f"step.{index}").read_text())
    except (FileNotFoundError, ValueError):
        return -1


def _job(folder: Path, floats: int) -> peer.Job:
    """Each peer's push once waits (up to ``HOLD_S``) until the other peer is 10 steps on:
    whichever peer owns the key, one of the two waits while the other pushes to it."""
    job = peer.Job("owner-computing", barrier=ASP(), seed=5)
    job.register_schedule(lambda ctx: ["w"])

    @job.register_push
    def push(ctx, values):
        part = folder / f"step.{ctx.index}.part"
        part.write_text(str(ctx.step))
        os.replace(part, folder / f"step.{ctx.index}")
        hold_at, until = HOLDS[ctx.index]
        if ctx.step == hold_at:
            deadline = time.monotonic() + HOLD_S
            while _read_step(folder, 1 - ctx.index) < until:
                if time.monotonic() > deadline:
                    (folder / f"stalled.{ctx.index}").write_text(
                        f"peer {1 - ctx.index} at step {_read_step(folder, 1 - ctx.index)}")
                    break
                # another process's progress, read from its file: polled, up to HOLD_S
                threading.Event().wait(0.002)
        return {"w": np.ones(floats)}

    @job.register_pull
    def pull(store, updates):
        w, _clock = store.get("w")
        store.set("w", w + updates["w"])

    job.register_stop(lambda ctx: ctx.step >= STEPS)
    return job


@pytest.fixture(scope="module")
def cluster():
    with actorpy.connect(workers=2) as c:
        yield c


@pytest.mark.parametrize("floats", [4, 300_000])    # 2.4 MB: over QUICK_MODEL_BYTES
def test_a_peer_whose_push_waits_still_answers_the_pushes_to_the_key_it_owns(cluster,
                                                                            tmp_path, floats):
    assert (floats * 8 > QUICK_MODEL_BYTES) == (floats > 4)
    result = _job(tmp_path, floats).run(cluster, peers=2, init={"w": np.zeros(floats)},
                                        timeout_s=60)
    stalled = {p.name: p.read_text() for p in tmp_path.glob("stalled.*")}
    assert stalled == {}, f"a peer's pushes waited for the owner's push: {stalled}"
    assert sorted(result.steps.values()) == [STEPS, STEPS]
    # One owner all along. A peer whose pushes waited out the owner's push evicted it and
    # took the key over, and pushes were folded again on the way (87-91 folds, owners
    # changing, in 3 runs before the owner answered while its push ran; with the large key
    # 84-105 folds in 3 runs before ``aside_kinds``)
    assert sorted(result.applied.values()) == [0, 2 * STEPS], result.applied
    assert result.updates == 2 * STEPS
    np.testing.assert_array_equal(result.model["w"], np.full(floats, 2.0 * STEPS))

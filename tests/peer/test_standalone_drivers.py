"""Several drivers on one overlay of standalone peers (in this process): a job's peers are
its driver's from JOB to END."""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from actorpy.barrier import ASP
from actorpy.errors import RemoteError
from actorpy.runtime.context import ServiceRef
from engines.peer.dialer import PEER_SERVICE
from engines.peer.overlay_run import OverlayClient
from engines.peer.runner import Phase
from engines.peer.shell import PeerKind
from tests.peer.linreg import init, linreg, shard
from tests.peer.test_standalone import SECRET, _peer


@pytest.fixture(scope="module")
def overlay():
    peers = [_peer()]
    try:
        for _ in range(3):
            peers.append(_peer(peers[0].endpoint))
        yield peers
    finally:
        for p in peers:
            p.close()


#: peer 0 of a job with ``_held_stop`` steps on until set (the other peers stop at step 2)
HOLD = threading.Event()


def _held_stop(ctx):
    return ctx.step >= 2 and (ctx.index != 0 or HOLD.is_set())


def test_a_peer_done_with_its_steps_stays_its_drivers_until_the_job_ends(overlay):
    # before: a peer whose runner was DONE (its steps over, its keys still served to the
    # peers still training) took another driver's JOB: its store emptied, the others' pushes
    # to it failed the first job (StaleCall: a call of another job) or it waited for ever
    HOLD.clear()
    job = linreg(ASP(), steps=2)
    job.register_stop(_held_stop)
    tried: list[Any] = []
    with OverlayClient(overlay[0].endpoint, secret=SECRET) as other:
        other.members()
        second = dataclasses.replace(job.spec(init()), run=7)

        def take_a_done_peer(run, seconds):
            done = [i for i, s in run.last.items() if s["phase"] == Phase.DONE]
            if not tried and done:
                ref = ServiceRef(run.refs[done[0]].node, PEER_SERVICE)
                try:
                    tried.append(other.call(ref, PeerKind.JOB, (second, job.config, 0, None)))
                    other.call(ref, PeerKind.END, second.run)
                except RemoteError as exc:
                    tried.append(exc)
            if tried or seconds > 15:
                HOLD.set()   # peer 0 may stop now
        try:
            result = job.run_overlay(overlay[1].endpoint, init(), secret=SECRET, data=shard,
                                     timeout_s=30, on_poll=take_a_done_peer)
        finally:
            HOLD.set()
    assert len(tried) == 1 and isinstance(tried[0], RemoteError), tried
    assert "is running job 'linreg' for another driver" in str(tried[0])
    assert result.lost == [] and len(result.steps) == 4


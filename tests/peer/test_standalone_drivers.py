"""Several drivers on one overlay of standalone peers (in this process): a job's peers are
its driver's from JOB to END, and of drivers that submit at once one runs its job."""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from actorpy.barrier import ASP, PSP
from actorpy.errors import ActorpyError, RemoteError
from actorpy.runtime.context import ServiceRef
from engines.peer.cluster_run import RunResult
from engines.peer.dialer import PEER_SERVICE
from engines.peer.overlay_run import OverlayClient
from engines.peer.runner import Phase
from engines.peer.shell import PeerKind
from tests.peer.linreg import init, linreg, shard
# overlay: test_standalone's fixture (4 peers), one of its own for this module
from tests.peer.test_standalone import SECRET, overlay  # noqa: F401


#: peer 0 of a job with ``_held_stop`` steps on until set (the other peers stop at step 2)
HOLD = threading.Event()


def _held_stop(ctx):
    return ctx.step >= 2 and (ctx.index != 0 or HOLD.is_set())


#: the drivers whose first JOB has got to its ``data`` (``_met``)
FIRST: list[int] = []
MET = threading.Condition()


def _met(index):
    """Each driver's first JOB waits (at most 2.5 s, under the driver's 5 s for an answer)
    for the other drivers' first JOBs: all reach their first peer before any goes on."""
    if index == 0:
        with MET:
            FIRST.append(index)
            MET.notify_all()
            MET.wait_for(lambda: len(FIRST) >= 4, 2.5)
    return shard(index)


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


def test_of_drivers_at_once_one_runs_its_job_and_the_others_are_refused(overlay):
    # before: each driver took the peer it found first (its bootstrap) first; each got one,
    # was refused at another's and ended its own job: none ran (4 CLI drivers: in 5 of 8)
    FIRST.clear()
    outcome: dict[int, Any] = {}

    def drive(i):
        job = linreg(PSP(sample=1, staleness=1), steps=5)
        try:
            outcome[i] = job.run_overlay(overlay[i].endpoint, init(), secret=SECRET,
                                         data=_met, timeout_s=60)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            outcome[i] = exc
    threads = [threading.Thread(target=drive, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    ran = [o for o in outcome.values() if isinstance(o, RunResult)]
    refused = [o for o in outcome.values() if isinstance(o, ActorpyError)
               and "is running job 'linreg' for another driver" in str(o)]
    assert len(ran) == 1 and len(refused) == 3, outcome
    assert sorted(ran[0].steps.values()) == [5] * 4

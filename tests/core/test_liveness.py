"""Liveness without the GIL: long C calls in a worker and in the driver are not deaths;
killed and stopped workers still are, within the configured bounds. Pure parts first."""
from __future__ import annotations

import errno
import os
import signal
import threading
import time

import zmq

import actorpy
from actorpy.runtime.liveness import (AUTH_HANGUPS, REFUSED_GRACE_S, LinkWatch, LivenessTimes,
                                      StallGuard, Verdict, judge)
from actorpy.runtime.node import NodeEvent, NodeEventKind
from tests.conftest import wait_until

TIMES = LivenessTimes.of(0.25, 2.0, 300.0)


class TestLinkWatch:
    def test_down_time_counts_from_the_disconnect_until_a_handshake(self):
        w = LinkWatch(now=0.0)
        assert w.down_for(0.5) == 0.5  # never up yet: down since it was opened
        w.on_event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, now=0.6)
        w.on_event(zmq.EVENT_DISCONNECTED, 0, now=3.0)
        w.on_event(zmq.EVENT_DISCONNECTED, 0, now=3.5)  # retries do not restart the clock
        assert w.down_for(4.0) == 1.0
        w.on_event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, now=4.2)
        assert w.down_for(9.0) == 0.0

    def test_a_peer_hanging_up_on_our_handshakes_means_a_wrong_secret(self):
        w = LinkWatch(now=0.0)
        timeouts = [w.on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, errno.EAGAIN, now=t)
                    for t in (1.0, 2.0, 3.0)]  # a stopped peer: the handshake times out
        assert timeouts == [None, None, None]
        hangups = [w.on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, errno.EPIPE, now=4.0)
                   for _ in range(AUTH_HANGUPS + 2)]
        assert hangups == [None] * (AUTH_HANGUPS - 1) + [Verdict.AUTH_FAILED, None, None]
        assert w.on_event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, now=5.0) is None and w.verdict is None

    def test_zap_refusal_and_mechanism_mismatch_are_proven_at_once(self):
        refused = LinkWatch(0.0).on_event(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400, 0.1)
        assert refused is Verdict.AUTH_FAILED
        assert LinkWatch(0.0).on_event(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, 0, 0.1) \
            is Verdict.PROTOCOL_MISMATCH


    def test_dials_refused_for_the_grace_on_a_link_never_up_mean_nothing_listens(self):
        w = LinkWatch(now=0.0)
        early = [w.on_event(zmq.EVENT_CONNECT_RETRIED, 100, now=t) for t in (0.1, 0.5, 0.9)]
        assert early == [None, None, None]  # a manager still starting gets REFUSED_GRACE_S
        assert w.on_event(zmq.EVENT_CONNECT_RETRIED, 100, now=REFUSED_GRACE_S) \
            is Verdict.NOT_LISTENING

    def test_a_link_given_a_longer_grace_waits_that_long(self):
        w = LinkWatch(now=0.0, refused_grace_s=30.0)   # an embedded cluster's manager
        assert w.on_event(zmq.EVENT_CONNECT_RETRIED, 100, now=0.1) is None
        assert w.on_event(zmq.EVENT_CONNECT_RETRIED, 100, now=REFUSED_GRACE_S + 5) is None
        assert w.on_event(zmq.EVENT_CONNECT_RETRIED, 100, now=30.1) is Verdict.NOT_LISTENING

    def test_a_dial_that_connects_or_a_link_once_up_is_not_refused(self):
        w = LinkWatch(now=0.0)
        w.on_event(zmq.EVENT_CONNECT_RETRIED, 100, now=0.5)
        w.on_event(zmq.EVENT_CONNECTED, 9, now=0.6)  # a listener (that may never answer)
        assert w.on_event(zmq.EVENT_CONNECT_RETRIED, 100, now=1.6) is None
        assert w.on_event(zmq.EVENT_CONNECT_RETRIED, 100, now=2.0) is None  # streak from 1.6
        up = LinkWatch(now=0.0)
        up.on_event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, now=0.1)
        up.on_event(zmq.EVENT_DISCONNECTED, 0, now=1.0)  # died: judged by its downtime
        assert [up.on_event(zmq.EVENT_CONNECT_RETRIED, 100, now=t) for t in (1.1, 5.0)] \
            == [None, None]


class TestJudge:
    def test_silence_alone_makes_a_node_suspect_and_a_broken_link_dead(self):
        assert judge(1.0, 0.0, TIMES) == ("alive", "")
        assert judge(60.0, 0.0, TIMES)[0] == "suspect"
        assert judge(0.0, TIMES.link_grace_s + 0.01, TIMES)[0] == "dead"
        assert judge(300.5, 0.0, TIMES)[0] == "dead"
        assert judge(1e6, 0.0, LivenessTimes.of(0.25, 2.0, 0.0))[0] == "suspect"

    def test_the_bound_adds_up(self):
        assert TIMES.bound_s == 0.25 + 1.0 + 1.0 + 0.25

    def test_a_stalled_observer_does_not_count_its_stall(self):
        g = StallGuard(0.25, now=0.0)
        ticks = [g.tick(t) for t in (0.25, 0.5, 0.76, 10.76, 11.0)]
        assert ticks == [0.0, 0.0, 0.0, 9.5, 0.0]


def _gil_hold(seconds: float) -> dict:
    """Hold the GIL in single C calls: sum(range(N)) sized to last ``seconds``, then a sort
    and a pickle of a big object graph. Returns how long each one took."""
    import pickle
    import random
    import time as t

    def timed(fn):
        start = t.monotonic()
        value = fn()
        return value, t.monotonic() - start
    n, held = 10**7, 0.0
    for _ in range(4):  # resize until one call lasts long enough (the machine's load varies)
        n = int(n * min(50.0, 1.2 * seconds / max(held, 1e-3))) if held else n
        total, held = timed(lambda: sum(range(n)))
        assert total == n * (n - 1) // 2
        if held >= seconds * 0.8:
            break
    rng = random.Random(7)
    floats = [rng.random() for _ in range(2_000_000)]
    _, sort_s = timed(floats.sort)
    assert all(a <= b for a, b in zip(floats[:1000], floats[1:1001]))
    graph = [(str(i), i) for i in range(1_500_000)]
    blob, pickle_s = timed(lambda: pickle.dumps(graph))
    return {"sum_s": held, "sort_s": sort_s, "pickle_s": pickle_s, "pickled": len(blob)}


def test_long_c_calls_in_a_worker_and_the_driver_are_not_deaths():
    hold_s = 2.5
    with actorpy.connect(workers=1, dead_after_s=1.0, manager_timeout_s=1.5) as cluster:
        (worker,) = cluster.workers()
        deaths: list[NodeEvent] = []
        cluster.subscribe(lambda ev: None if ev.kind is NodeEventKind.JOINED else deaths.append(ev))
        busy = cluster.submit_to(worker, _gil_hold, hold_s)
        wait_until(lambda: any(r["node_id"] == worker and r["heartbeat_age_s"] > 0.5
                               for r in cluster.nodes()), 30, "the worker to go quiet")
        mine = _gil_hold(hold_s)  # the driver, meanwhile, in the same kind of calls
        theirs = busy.result(timeout=120)
        for held in (mine, theirs):  # the premise: a hold outlasts the old thresholds
            assert max(held["sum_s"], held["sort_s"], held["pickle_s"]) > 1.5, held
            assert held["pickled"] > 20 << 20
        assert deaths == []
        assert cluster.workers() == [worker]
        assert cluster.submit(lambda: 6 * 7).result(timeout=30) == 42
        # Suspect while silent, alive again once they heartbeat: never dead.
        states = lambda: {r["node_id"]: r["state"] for r in cluster.nodes()}  # noqa: E731
        wait_until(lambda: set(states().values()) == {"alive"}, 10, "both to be alive again")
        assert deaths == []


def test_stopped_worker_is_dead_within_the_bound_then_fenced():
    with actorpy.connect(workers=2, dead_after_s=1.0, manager_timeout_s=1.5) as cluster:
        victim = cluster.workers()[0]
        pid = {r["node_id"]: r["pid"] for r in cluster.nodes()}[victim]
        gone = threading.Event()
        cluster.on_node_lost(lambda n: gone.set() if n == victim else None)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            assert gone.wait(15), "the stopped worker was never declared dead"
            detected = time.monotonic() - t0
        finally:
            os.kill(pid, signal.SIGCONT)
        bound = LivenessTimes.of(0.25, 1.0).bound_s
        assert detected <= bound + 2.0, f"declared dead after {detected:.2f} s (bound {bound} s)"
        wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                   open(f"/proc/{pid}/stat").read().split(") ", 1)[1][0] == "Z", 15,
                   "the fenced worker to exit by itself")
        # not a requested stop (its status is there once all its threads are gone)
        assert wait_until(lambda: cluster.local.exited([victim]), 10, "its exit status") \
            == {victim: 1}
        assert cluster.submit(lambda: "still working").result(30) == "still working"

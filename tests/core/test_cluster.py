"""The driver's Cluster: where tasks go (free slots), map's overall deadline, and task names
that cost nothing (never a repr of the task's data)."""
from __future__ import annotations

import itertools
import math
import os
import re
import threading
import time

import pytest

import actorpy
from actorpy.errors import ActorpyTimeout, ConfigError
from actorpy.runtime.cluster import Cluster, task_name
from actorpy.runtime.context import CallTask
from actorpy.runtime.tasks import ContextCallTask
from actorpy.runtime.node import Peer


def hold(seconds: float) -> int:
    """A task that keeps its worker busy (no sleep: an event nobody sets)."""
    threading.Event().wait(seconds)
    return os.getpid()


def hold_until(path: str, limit_s: float) -> int:
    """A task that keeps its worker busy until ``path`` exists."""
    deadline = time.monotonic() + limit_s
    tick = threading.Event()
    while not os.path.exists(path) and time.monotonic() < deadline:
        tick.wait(0.02)
    return os.getpid()


class Priceless:
    """A task whose repr must never be taken (it would render all its data, or raise)."""

    reprs = 0

    def __init__(self, n: int) -> None:
        self.data = list(range(n))

    def __repr__(self) -> str:
        type(self).reprs += 1
        raise RuntimeError("repr of a task is not allowed")

    def run(self, ctx) -> int:
        return sum(self.data)

    def __call__(self, k: int) -> int:
        return k * len(self.data)


@pytest.fixture(scope="module")
def cluster():
    with actorpy.connect(workers=2) as c:
        yield c


class TestTaskNames:
    def test_names_are_type_or_function_names(self):
        import functools
        assert task_name(CallTask(hold)) == "task hold"
        assert task_name(CallTask(functools.partial(hold, 1.0))) == "task hold"
        assert task_name(CallTask(Priceless.run)) == "task Priceless.run"
        assert task_name(CallTask(Priceless)) == "task Priceless"
        assert task_name(Priceless(3)) == "task Priceless"
        assert task_name(CallTask(Priceless(3))) == "task Priceless"
        assert Priceless.reprs == 0

    def test_submitting_never_takes_a_repr(self, cluster):
        task = Priceless(10_000)
        fut = cluster.submit_task(task)
        assert fut.what == "task Priceless"
        assert fut.result(30) == sum(range(10_000))
        assert cluster.submit(Priceless(7), 6).result(30) == 42
        named = cluster.submit_task(Priceless(2), what="stage 3 partition 1")
        assert named.result(30) == 1 and named.what == "stage 3 partition 1"
        assert Priceless.reprs == 0


class TestPlacement:
    def test_a_busy_worker_gets_nothing_while_another_is_idle(self, cluster, tmp_path):
        gate = str(tmp_path / "open")
        slow = cluster.submit(hold_until, gate, 60.0)
        quick = cluster.submit(os.getpid).result(30)
        # a reply's bookkeeping runs on the I/O thread just after the waiter wakes; one more
        # round trip through that thread makes sure it is done
        cluster.nodes()
        # round robin would now queue this behind `slow`, on the busy worker
        after = cluster.submit(os.getpid)
        try:
            assert after.result(20) == quick
            assert not slow.done()
        finally:
            open(gate, "w").close()
        assert slow.result(30) != quick

    def test_most_free_slots_first_and_ties_in_turn(self):
        c = object.__new__(Cluster)     # the placement rule alone, without processes
        peers = [Peer("w-a", "ipc://a", "worker", 2), Peer("w-b", "ipc://b", "worker", 1)]
        c.node = type("Directory", (), {"peers": lambda self, role=None: peers})()
        c._rr, c._in_flight, c._load_lock = itertools.count(), {}, threading.Lock()
        picks = []
        for _ in range(3):
            with c._load_lock:
                dest = c._least_loaded()
                c._in_flight[dest] = c._in_flight.get(dest, 0) + 1
            picks.append(dest)
        assert sorted(picks) == ["w-a", "w-a", "w-b"]      # 2 slots + 1 slot, all busy now
        c._task_done("w-b")
        assert c._pick_worker() == "w-b"                  # the only free slot
        assert c._in_flight == {"w-a": 2}
        c._in_flight.clear()
        assert [c._pick_worker() for _ in range(4)] == ["w-a"] * 4   # 2 free beats 1 free
        peers[0] = Peer("w-a", "ipc://a", "worker", 1)
        assert sorted(c._pick_worker() for _ in range(4)) == ["w-a", "w-a", "w-b", "w-b"]


    def test_a_node_that_never_was_is_not_said_to_be_lost(self, cluster):
        # before: "node w-nobody was lost while running task pow: unknown to the manager"
        with pytest.raises(actorpy.NodeLost, match="no node w-nobody is known in this "
                                                   "cluster: unknown to the manager; task pow "
                                                   "was not run"):
            cluster.submit_to("w-nobody", pow, 2, 2).result(timeout=30)


class TestLongWaits:
    def test_a_wait_longer_than_a_lock_can_wait_means_no_limit(self, cluster):
        # a lock waits at most threading.TIMEOUT_MAX (~292 years): past it, OverflowError
        assert cluster.map(len, ["a", "bb"], timeout_s=1e10) == [1, 2]
        stream = cluster.submit_stream_task(
            ContextCallTask(lambda ctx, n: [ctx.emit(i) for i in range(n)] and n, (3,), None),
            timeout_s=1e10)
        assert list(stream) == [0, 1, 2] and stream.result(1e10) == 3


class TestStreamResult:
    def test_a_streams_result_takes_its_limit_as_a_futures_does(self, cluster):
        # the README's `.result(timeout=30)` was a TypeError for a stream (its only form
        # was result(timeout_s), with no default), after the stream loop had run
        def run():
            return cluster.submit_stream(lambda ctx: ctx.emit(1) or 2)
        assert cluster.submit(len, "ab").result(timeout=30) == 2
        stream = run()
        assert list(stream) == [1] and stream.result(timeout=30) == 2
        assert run().result() == 2 and run().result(30) == 2
        assert run().result(timeout_s=30) == 2 and run().result(None) == 2
        with pytest.raises(ConfigError, match="not both"):
            run().result(30, timeout_s=30)


class TestMapDeadline:
    def test_timeout_is_for_the_whole_map(self):
        with actorpy.connect(workers=2) as cluster:
            assert cluster.map(len, ["a", "bb", ""], timeout_s=30) == [1, 2, 0]
            # 8 items of 0.5 s on 2 workers need ~2 s; each item alone is within 1 s
            t0 = time.monotonic()
            with pytest.raises(ActorpyTimeout) as info:
                cluster.map(hold, [0.5] * 8, timeout_s=1.0)
            waited = time.monotonic() - t0
            assert 1.0 <= waited < 2.5, f"map gave up after {waited:.2f} s"
            assert "timeout_s=1.0" in str(info.value) and "task hold" in str(info.value)
            assert isinstance(info.value, TimeoutError)
            pids = cluster.map(hold, [0.0] * 4, timeout_s=60)
            assert len(pids) == 4 and set(pids) <= {r["pid"] for r in cluster.nodes()}


    def test_a_timeout_that_is_no_number_is_refused(self, cluster):
        # NaN timed out at once ("1 not done within timeout_s=nan"), as if the work had been
        # slow; a str was a TypeError from the deadline's arithmetic
        for bad in (math.nan, "10", None):
            with pytest.raises(ConfigError, match=re.escape(
                    f"timeout_s must be a number of seconds, got {bad!r}")):
                cluster.map(len, ["a"], timeout_s=bad)
        assert cluster.map(len, ["a"], timeout_s=30) == [1]
        # a stream's next(nan) and result(nan) waited without limit, a str was a TypeError
        stream = cluster.submit_stream(lambda ctx: ctx.emit(1) or 2)
        for bad in (math.nan, "10"):
            with pytest.raises(ConfigError, match="timeout_s must be a number of seconds"):
                stream.next(bad)
            with pytest.raises(ConfigError, match="timeout_s must be a number of seconds"):
                stream.result(bad)
        assert stream.next(30) == 1 and stream.result(30) == 2


class TestTerminated:
    def test_a_call_after_the_with_block_says_the_cluster_was_terminated(self):
        # before: "node d-... is closed", which reads as a lost node, not a finished `with`
        with actorpy.connect(workers=1) as cluster:
            assert cluster.submit(abs, -3).result(30) == 3
        for call in (lambda: cluster.submit(abs, -3), lambda: cluster.map(abs, [1], timeout_s=5),
                     lambda: cluster.lookup("anything")):
            with pytest.raises(actorpy.NodeLost, match=r"is closed: this cluster was terminated "
                                                       r"\(its `with actorpy\.connect\(\.\.\.\)` "
                                                       r"block ended"):
                call()

"""Real processes: the embedded local cluster, remote execution, services, direct exchange."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import actorpy
from actorpy.errors import ActorpyTimeout, RemoteError, SerializationError


class CustomError(Exception):
    pass


class Unpicklable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def fail_deep(x: int) -> int:
    def inner() -> int:
        return 1 // x
    return inner()


@pytest.fixture(scope="module")
def cluster():
    with actorpy.connect(workers=2) as c:
        yield c


class TestRemoteExecution:
    def test_results_and_placement(self, cluster):
        workers = cluster.workers()
        assert len(workers) == 2
        got = {w: cluster.submit_to(w, lambda: __import__("os").getpid()).result(30)
               for w in workers}
        pids = {row["node_id"]: row["pid"] for row in cluster.nodes()}
        assert got == {w: pids[w] for w in workers}
        assert cluster.map(lambda x: x * x, range(20), timeout_s=30) == [x * x for x in range(20)]

    def test_arrays_round_trip(self, cluster):
        rng = np.random.default_rng(3)
        a = rng.standard_normal((300, 200))
        out = cluster.submit(lambda m: (m.T @ m, m[::2, ::3]), a).result(30)
        np.testing.assert_allclose(out[0], a.T @ a)
        np.testing.assert_array_equal(out[1], a[::2, ::3])

    def test_remote_error_carries_details(self, cluster):
        with pytest.raises(RemoteError) as info:
            cluster.submit(fail_deep, 0).result(30)
        err = info.value
        assert err.remote_type == "ZeroDivisionError"
        assert "division" in err.remote_message
        assert "inner" in err.remote_traceback and "fail_deep" in err.remote_traceback
        assert err.node_id in cluster.workers()
        assert isinstance(err.__cause__, ZeroDivisionError)
        assert "remote traceback" in str(err)

    def test_custom_and_unpicklable_exceptions(self, cluster):
        def raise_custom():
            raise CustomError("bad input 42")
        with pytest.raises(RemoteError) as info:
            cluster.submit(raise_custom).result(30)
        assert info.value.remote_type.endswith("CustomError")
        assert isinstance(info.value.__cause__, CustomError)

        def raise_unpicklable():
            raise Unpicklable("holds a lock")
        with pytest.raises(RemoteError) as info:
            cluster.submit(raise_unpicklable).result(30)
        assert info.value.remote_message == "holds a lock"
        assert info.value.__cause__ is None

    def test_a_huge_message_arrives_cut(self, cluster):
        # before: a 5 MB message came back as a 10 MB RemoteError text (message and
        # traceback), its cause holding the 5 MB too (50 MB: 100 MB and 800 MB of memory)
        def raise_huge():
            raise ValueError("HEAD" + "x" * 5_000_000 + "TAIL")
        with pytest.raises(RemoteError) as info:
            cluster.submit(raise_huge).result(30)
        err = info.value
        message = err.remote_message
        assert message.startswith("HEAD") and message.endswith("TAIL")
        assert "[... 4,991,816 of 5,000,008 characters cut ...]" in message
        assert len(message) < 9000 and len(str(err)) < 20_000
        assert "raise_huge" in err.remote_traceback and "characters cut" in err.remote_traceback
        assert isinstance(err.__cause__, ValueError) and str(err.__cause__) == message

    def test_unpicklable_function_fails_in_driver(self, cluster):
        lock = threading.Lock()
        with pytest.raises(SerializationError, match="lock"):
            cluster.submit(lambda: lock.locked())

    def test_unpicklable_result_is_reported(self, cluster):
        with pytest.raises(RemoteError, match="lock"):
            cluster.submit(lambda: __import__("threading").Lock()).result(30)

    def test_timeout_is_a_timeout_error(self, cluster):
        release = "actorpy-test-never-set"
        fut = cluster.submit(lambda: __import__("threading").Event().wait(2) or release)
        with pytest.raises(TimeoutError):
            fut.result(timeout=0.05)
        with pytest.raises(ActorpyTimeout):
            fut.result(timeout=0.05)
        assert fut.result(timeout=30) == release


class Counter:
    def __init__(self, ctx, start):
        self.total = start

    def handle(self, msg, ctx):
        if msg.kind == 1:
            self.total += msg.payload()
            if msg.header.request_id:
                ctx.reply(msg, self.total)
        elif msg.kind == 2:
            raise ValueError(f"refused {msg.payload()}")


class TestServices:
    def test_service_calls_in_order(self, cluster):
        ref = cluster.start_service(Counter, 10, name="counter")
        for i in range(5):
            cluster.cast(ref, 1, i)
        assert cluster.call(ref, 1, 100, timeout_s=30) == 10 + sum(range(5)) + 100
        with pytest.raises(RemoteError, match="refused 7"):
            cluster.call(ref, 2, 7, timeout_s=30)
        assert cluster.call(ref, 1, 0, timeout_s=30) == 120  # still serving
        assert cluster.stop_service(ref) is True

    def test_bad_factory(self, cluster):
        with pytest.raises(RemoteError, match="handle"):
            cluster.start_service(lambda ctx: object())


def put_block(ctx, key, n):
    block = np.arange(n, dtype=np.float64)
    return ctx.put(key, block)


def pull_block(ctx, owner, key):
    block = ctx.fetch(owner, key, timeout_s=60)
    return float(block.sum()), block.shape, block.flags.writeable


class PutTask:
    def __init__(self, key, n):
        self.key, self.n = key, n

    def run(self, ctx):
        return put_block(ctx, self.key, self.n)


class PullTask:
    def __init__(self, owner, key):
        self.owner, self.key = owner, key

    def run(self, ctx):
        return pull_block(ctx, self.owner, self.key)


def test_workers_exchange_large_array_directly(cluster):
    a, b = cluster.workers()
    n = 4_000_000  # 32 MB
    before = cluster.node.bytes_in
    assert cluster.submit_task(PutTask("blk", n), a).result(60) >= n * 8
    total, shape, writable = cluster.submit_task(PullTask(a, "blk"), b).result(60)
    assert shape == (n,) and total == float(np.arange(n, dtype=np.float64).sum()) and writable
    # The 32 MB went worker to worker: the driver received only two small replies.
    assert cluster.node.bytes_in - before < 64 << 10
    with pytest.raises(RemoteError, match="not stored"):
        cluster.submit_task(PullTask(a, "missing"), b).result(60)

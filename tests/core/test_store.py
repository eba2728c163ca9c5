"""The object store: budget and spilling, snapshots, streams read segment by segment, delete by
prefix, thread safety; then the same through a real local cluster (fetch of spilled blocks
worker to worker, fetch_iter of a block many times the budget, spill files gone after delete,
kill -9 and the cluster's end)."""
from __future__ import annotations

import os
import random
import signal
import threading
import tracemalloc

import numpy as np
import pytest

import actorpy
from actorpy.errors import RemoteError, StoreError
from actorpy.runtime.keyindex import KeyIndex
from actorpy.runtime.membership import MANAGER_ID
from actorpy.runtime.store import (ENTRY_OVERHEAD_BYTES, HEAD, ObjectStore, SegmentRequest,
                                   StreamHead)
from actorpy.wire import serde
from tests.conftest import wait_until

KB, MB = 1 << 10, 1 << 20


@pytest.fixture
def make_store(tmp_path):
    stores: list[ObjectStore] = []

    def make(budget_bytes: int, chunk_bytes: int = 512 * KB) -> ObjectStore:
        store = ObjectStore(budget_bytes=budget_bytes, chunk_bytes=chunk_bytes,
                            store_dir=str(tmp_path), name="w-test")
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def spill_files(store: ObjectStore) -> list[str]:
    path = store.stats().spill_dir
    return sorted(os.listdir(path)) if path and os.path.isdir(path) else []


def records(rng: random.Random, n: int) -> list[tuple[str, int]]:
    return [(f"word{rng.randrange(5000)}", i) for i in range(n)]


class TestBudget:
    def test_many_small_values_stay_within_the_budget(self, make_store):
        budget = 64 * KB
        store = make_store(budget)
        rng = np.random.default_rng(7)
        values = {f"job/v{i}": rng.integers(0, 1000, size=int(rng.integers(10, 2000)))
                  for i in range(200)}
        for key, value in values.items():
            store.put(key, value)
            assert store.stats().memory_bytes <= budget
        stats = store.stats()
        total = sum(store.serve(k).nbytes for k in values)
        assert stats.keys == 200 and stats.spill_files > 0
        assert stats.spilled_bytes + stats.memory_bytes - ENTRY_OVERHEAD_BYTES * (
            stats.segments - stats.spill_files) == total
        assert len(spill_files(store)) == stats.spill_files
        for key, value in values.items():
            assert np.array_equal(store.get(key), value)

    def test_a_value_larger_than_the_budget_goes_to_disk_whole(self, make_store):
        store = make_store(32 * KB)
        big = np.arange(100_000, dtype=np.float64)  # 800 KB, split into two frames
        assert store.put("big", big) > big.nbytes
        stats = store.stats()
        assert stats.memory_bytes == 0 and stats.spill_files == 1
        got = store.get("big")
        assert np.array_equal(got, big)
        got[:] = -1  # chunks were joined into a copy: changing it leaves the block alone
        assert np.array_equal(store.get("big"), big)

    def test_zero_budget_spills_everything_and_a_stream_reads_back_in_order(self, make_store):
        store = make_store(0)
        items = records(random.Random(3), 20_000)
        size = store.put_stream("s", iter(items), segment_bytes=16 * KB)
        stats = store.stats()
        assert stats.memory_bytes == 0 and stats.spilled_bytes == size
        assert stats.segments == stats.spill_files > 5
        assert list(store.iterate("s")) == items
        assert store.get("s") == items


class TestSnapshot:
    @pytest.mark.parametrize("budget", [64 * MB, 0], ids=["memory", "spilled"])
    def test_changing_an_array_after_put_does_not_change_the_block(self, make_store, budget):
        store = make_store(budget)
        a = np.arange(50_000, dtype=np.int64)
        value = {"a": a, "meta": [1, 2]}
        store.put("k", value)
        a[:] = -1
        value["meta"].append(3)
        got = store.get("k")
        assert np.array_equal(got["a"], np.arange(50_000)) and got["meta"] == [1, 2]
        frames = store.serve("k").frames
        assert all(memoryview(f).readonly for f in frames)
        with pytest.raises(ValueError, match="read-only"):
            got["a"][0] = 5  # shares the store's memory (one frame), so it is read-only

    def test_a_stream_of_arrays_is_a_snapshot_too(self, make_store):
        store = make_store(64 * MB)
        rows = [np.full(1000, i) for i in range(10)]
        store.put_stream("rows", rows)
        for row in rows:
            row += 100
        assert [int(r[0]) for r in store.iterate("rows")] == list(range(10))


class TestStreams:
    def test_segments_are_served_one_by_one_with_a_head(self, make_store):
        store = make_store(256 * KB)
        items = records(random.Random(11), 30_000)
        store.put_stream("job/s", items, segment_bytes=32 * KB)
        head = store.serve(SegmentRequest("job/s", HEAD))
        assert isinstance(head, StreamHead) and head.stream and head.segments > 5
        parts = [store.serve(SegmentRequest("job/s", i, head.version)).decode()
                 for i in range(head.segments)]
        assert [x for part in parts for x in part] == items
        whole = store.serve("job/s")
        assert isinstance(whole, serde.JoinedLists)
        frames, has_layout = serde.encode(whole, 16 * KB)
        assert serde.decode([bytes(memoryview(f)) for f in frames], has_layout) == items
        with pytest.raises(IndexError, match="segments"):
            store.serve(SegmentRequest("job/s", head.segments, head.version))
        store.put_stream("job/s", items[:10])
        with pytest.raises(KeyError, match="stored again"):
            store.serve(SegmentRequest("job/s", 0, head.version))
        with pytest.raises(TypeError, match="SegmentRequest"):
            store.serve(("job/s", 0))

    def test_a_failing_iterable_stores_nothing_and_leaves_no_file(self, make_store):
        store = make_store(8 * KB)

        def items():
            yield from records(random.Random(1), 5000)
            raise ValueError("source broke")

        with pytest.raises(ValueError, match="source broke"):
            store.put_stream("s", items(), segment_bytes=4 * KB)
        stats = store.stats()
        assert "s" not in store and stats.segments == stats.memory_bytes == 0
        assert spill_files(store) == []

    def test_iterating_a_plain_value_yields_its_items(self, make_store):
        store = make_store(MB)
        store.put("list", [1, 2, 3])
        store.put("int", 5)
        assert list(store.iterate("list")) == [1, 2, 3]
        with pytest.raises(TypeError, match="not iterable"):
            list(store.iterate("int"))


class TestDelete:
    def test_delete_by_prefix_matches_a_scan_and_removes_files(self, make_store):
        store = make_store(4 * KB)
        rng = random.Random(5)
        keys = {f"job{rng.randrange(12)}/stage{rng.randrange(3)}/part{rng.randrange(40)}"
                for _ in range(600)}
        for key in keys:
            store.put(key, rng.randbytes(rng.randrange(10, 3000)))
        for prefix in ["job1/", "job1", "job3/stage2/", "job4/stage0/part1", "nothing/", "job"]:
            expected = {k for k in keys if k.startswith(prefix)}
            assert store.delete(prefix) == len(expected)
            keys -= expected
            assert all(k in store for k in keys) and len(store) == len(keys)
        stats = store.stats()
        assert stats.keys == stats.memory_bytes == stats.spill_files == 0
        assert spill_files(store) == []

    def test_storing_a_key_again_frees_the_old_block(self, make_store):
        store = make_store(0)
        store.put("k", b"x" * 10_000)
        store.put("k", b"y" * 20_000)
        assert store.get("k") == b"y" * 20_000
        assert store.stats().spill_files == 1 and len(spill_files(store)) == 1

    def test_close_removes_the_spill_directory(self, make_store):
        store = make_store(0)
        store.put("k", b"x" * 10_000)
        path = store.stats().spill_dir
        assert path and os.stat(path).st_mode & 0o777 == 0o700
        store.close()
        assert not os.path.exists(path)
        with pytest.raises(StoreError, match="closed"):
            store.put("k", 1)


class TestOwners:
    def test_an_owner_that_is_gone_takes_its_blocks_and_stores_no_more(self, make_store):
        store = make_store(4 * KB)
        store.put("a/1", b"x" * 10_000, owner="d-1")              # spilled
        store.put_stream("a/2", iter(range(100)), owner="d-1")
        store.put("b/1", b"y", owner="d-2")
        store.put("c/1", b"z")
        assert store.drop_owner("d-1") == 2
        assert sorted(store.keys()) == ["b/1", "c/1"] and spill_files(store) == []
        # a task of d-1 still finishing: before, its late put stayed for good
        with pytest.raises(StoreError, match="belongs to d-1, which is gone"):
            store.put("a/3", b"late", owner="d-1")
        assert "a/3" not in store and store.delete("a/") == 0
        assert store.stats().keys == 2
        store.put("b/1", b"y2")                                 # another put takes it over
        store.put("b/2", b"w", owner="d-2")
        assert store.delete("b/2") == 1 and store.drop_owner("d-2") == 0
        assert sorted(store.keys()) == ["b/1", "c/1"]


class TestKeyIndex:
    def test_matches_a_brute_force_scan(self):
        rng = random.Random(9)
        index, oracle = KeyIndex(), set()
        parts = ["a", "ab", "b", "", "a/b", "x"]
        for step in range(3000):
            key = "/".join(rng.choice(parts) for _ in range(rng.randrange(1, 4)))
            if rng.random() < 0.7:
                index.add(key)
                oracle.add(key)
            elif rng.random() < 0.5:
                index.discard(key)
                oracle.discard(key)
            else:
                prefix = key[:rng.randrange(len(key) + 1)]
                expected = {k for k in oracle if k.startswith(prefix)}
                assert sorted(index.pop_prefix(prefix)) == sorted(expected), (step, prefix)
                oracle -= expected
            assert len(index) == len(oracle)


class TestThreads:
    def test_concurrent_puts_and_deletes_keep_the_books_straight(self, make_store):
        store = make_store(256 * KB)
        errors: list[BaseException] = []

        def work(t: int) -> None:
            rng = random.Random(t)
            try:
                for i in range(150):
                    value = rng.randbytes(rng.randrange(100, 8000))
                    store.put(f"t{t}/k{i % 20}", value)
                    assert store.get(f"t{t}/k{i % 20}") == value
                    if i % 37 == 0:
                        store.delete(f"t{t}/k1")  # k1 and k10..k19
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert not errors and not any(th.is_alive() for th in threads)
        stats = store.stats()
        assert stats.memory_bytes <= 256 * KB
        assert len(spill_files(store)) == stats.spill_files
        store.delete("")
        stats = store.stats()
        assert stats.keys == stats.memory_bytes == stats.spilled_bytes == 0
        assert spill_files(store) == []


# --------------------------------------------------------------------------- real processes
class Run:
    """A task calling ``fn(ctx, *args)`` on a worker (functions below are importable)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def run(self, ctx):
        return self.fn(ctx, *self.args)


def put_spilled(ctx, n):
    size = ctx.put("job/arr", np.arange(n, dtype=np.float64))
    ctx.put_stream("job/words", (f"w{i % 977}:{i}" for i in range(n // 2)), segment_bytes=256 * KB)
    return size, ctx.store.stats()


def read_back(ctx, owner, n):
    arr = ctx.fetch(owner, "job/arr", timeout_s=60)
    words = ctx.fetch(owner, "job/words", timeout_s=60)
    return float(arr.sum()), arr.flags.writeable, len(words), words[-1]


def merge_stream(ctx, owner):
    """Consume a stream with tracemalloc on: the peak of Python memory while reading."""
    tracemalloc.start()
    try:
        count = total = 0
        for word, value in ctx.fetch_iter(owner, "job/big", timeout_s=60):
            count += 1
            total += value
        return count, total, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def put_big_stream(ctx, n):
    return ctx.put_stream("job/big", ((f"{i * 7919:016x}", i) for i in range(n)),
                          segment_bytes=256 * KB), ctx.store.stats()


BUDGET = 2 * MB


@pytest.fixture(scope="module")
def cluster():
    # A 2 MB frame limit: every value above it must be split to arrive at all.
    with actorpy.connect(workers=2, store_budget_bytes=BUDGET, max_frame_bytes=2 * MB) as c:
        yield c


class TestCluster:
    def test_a_spilled_block_is_fetched_by_another_worker(self, cluster):
        a, b = cluster.workers()
        n = 1_000_000  # 8 MB: four times the budget
        size, stats = cluster.submit_task(Run(put_spilled, n), a).result(60)
        assert size >= n * 8 and stats.spilled_bytes >= n * 8 and stats.memory_bytes <= BUDGET
        total, writable, count, last = cluster.submit_task(Run(read_back, a, n), b).result(60)
        assert total == float(np.arange(n, dtype=np.float64).sum()) and writable
        assert count == n // 2 and last == f"w{(n // 2 - 1) % 977}:{n // 2 - 1}"
        assert cluster.fetch(a, "job/words", timeout_s=60)[:2] == ["w0:0", "w1:1"]
        with pytest.raises(RemoteError, match="not stored"):
            cluster.fetch(a, "job/missing", timeout_s=60)

    def test_fetch_iter_reads_a_block_many_times_the_budget_in_bounded_memory(self, cluster):
        a, b = cluster.workers()
        n = 600_000
        size, stats = cluster.submit_task(Run(put_big_stream, n), a).result(120)
        assert size > 4 * BUDGET and stats.memory_bytes <= BUDGET
        count, total, peak = cluster.submit_task(Run(merge_stream, a), b).result(120)
        assert count == n and total == n * (n - 1) // 2
        # The items alone (tuples of str and int) take ~150 bytes each: 90 MB for the
        # block; a reader holding two segments at a time stays far below that.
        assert peak < 12 * MB, f"reading peaked at {peak / MB:.1f} MB"
        # Stopping early releases the stream (no error, no lingering request).
        first = next(iter(cluster.fetch_iter(a, "job/big", timeout_s=60)))
        assert first[1] == 0

    def test_a_3mb_pickled_value_crosses_a_2mb_frame_limit(self, cluster):
        blob = os.urandom(3 * MB)
        assert cluster.submit(len, blob).result(60) == 3 * MB
        rows = [(f"k{i}", i) for i in range(200_000)]  # ~3 MB of pickle
        assert cluster.submit(list, rows).result(60) == rows


def store_keys(ctx):
    return sorted(ctx.store.keys())


def test_the_blocks_a_driver_stored_go_when_it_leaves():
    # before: a driver killed or stopped with Ctrl-C mid-job left its blocks on the workers
    with actorpy.connect(workers=1) as cluster:
        [worker] = cluster.workers()
        other = actorpy.connect(cluster.node.peer(MANAGER_ID).address)
        try:
            other.submit_task(Run(put_block, "theirs/1"), worker).result(60)
            cluster.submit_task(Run(put_block, "mine/1"), worker).result(60)
            assert cluster.submit_task(Run(store_keys), worker).result(60) == [
                "mine/1", "theirs/1"]
        finally:
            other.terminate()
        wait_until(lambda: cluster.submit_task(Run(store_keys), worker).result(60)
                   == ["mine/1"], 30, "the departed driver's block dropped")


def put_block(ctx, key):
    return ctx.put(key, np.ones(1000))


def spill_some(ctx, tag):
    ctx.put(f"{tag}/a", np.ones(400_000))   # 3.2 MB > budget: spilled
    ctx.put(f"{tag}/b", np.zeros(400_000))
    stats = ctx.store.stats()
    return stats.spill_dir, sorted(os.listdir(stats.spill_dir)), os.getpid()


def delete_and_list(ctx, prefix):
    removed = ctx.delete(prefix)
    return removed, sorted(os.listdir(ctx.store.stats().spill_dir))


def test_spill_files_go_with_delete_a_kill_and_the_cluster():
    with actorpy.connect(workers=2, store_budget_bytes=BUDGET) as cluster:
        a, b = cluster.workers()
        dir_a, files_a, _ = cluster.submit_task(Run(spill_some, "x"), a).result(60)
        dir_b, files_b, pid_b = cluster.submit_task(Run(spill_some, "y"), b).result(60)
        assert len(files_a) == len(files_b) == 2 and dir_a != dir_b
        assert dir_a.startswith(cluster.local.dir)  # inside the cluster's private directory
        assert cluster.submit_task(Run(delete_and_list, "x/"), a).result(60) == (2, [])
        os.kill(pid_b, signal.SIGKILL)
        wait_until(lambda: b not in cluster.workers(), 30, "the killed worker to be declared dead")
        assert sorted(os.listdir(dir_b)) == files_b  # nobody cleaned up after the kill ...
    assert not os.path.exists(dir_a) and not os.path.exists(dir_b)  # ... until the cluster went


class TestConfig:
    def test_budget_and_directory_come_from_the_environment(self):
        from actorpy.config import Config
        from actorpy.errors import ConfigError

        config = Config.from_env({"ACTORPY_STORE_BUDGET_BYTES": "12345",
                                  "ACTORPY_STORE_DIR": "/somewhere"})
        assert (config.store_budget_bytes, config.store_dir) == (12345, "/somewhere")
        with pytest.raises(ConfigError, match="store_budget_bytes"):
            Config(store_budget_bytes=-1)

    def test_default_budget_shares_a_quarter_of_memory_between_workers(self):
        from actorpy.runtime.spill import default_budget_bytes, physical_memory_bytes

        total = physical_memory_bytes()
        assert default_budget_bytes(4) == max(64 * MB, int(total * 0.25 / 4))
        assert default_budget_bytes(1) >= default_budget_bytes(8)

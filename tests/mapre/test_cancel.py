"""A given-up job's reduce tasks stop fetching and merging their shuffle inputs: at the next
chunk they read, or within ``CANCEL_CHECK_S`` of a fetch that has not come."""
from __future__ import annotations

import os
import signal
import threading

import pytest

import actorpy
from actorpy.errors import TaskCancelled
from actorpy.runtime.reply import ReplyFuture
from engines import mapre
from engines.mapre import shuffle
from tests.conftest import wait_until


class FakeContext:
    """A reduce task's context whose one remote fetch never answers."""

    node_id = "w-me"

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.fetch = ReplyFuture("w-other", "fetch")

    def fetch_async(self, node: str, key: str) -> ReplyFuture:
        return self.fetch

    def check_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise TaskCancelled("the job was given up")


def test_a_wait_for_a_fetch_ends_when_its_task_is_cancelled():
    # before: the wait went on for the job's time left (here 60 s) after the cancel
    ctx = FakeContext()
    raised: list[BaseException] = []

    def reduce() -> None:
        try:
            list(shuffle.fetch_blocks(ctx, [shuffle.Block("w-other", "k", 1)], timeout_s=60))
        except BaseException as exc:  # noqa: BLE001 - the test looks at what it was
            raised.append(exc)
    reader = threading.Thread(target=reduce)
    reader.start()
    try:
        ctx.cancelled.set()
        reader.join(10 * shuffle.CANCEL_CHECK_S + 2)
        assert not reader.is_alive(), "the fetch went on after its task was cancelled"
        assert len(raised) == 1 and isinstance(raised[0], TaskCancelled), raised
    finally:
        if not ctx.fetch.done():
            ctx.fetch.set_result([])   # let the old code's reader end
        reader.join(10)


def test_a_fetch_that_never_comes_still_times_out():
    ctx = FakeContext()
    with pytest.raises(shuffle.FetchFailed, match="no reply within 0.3 s"):
        list(shuffle.fetch_blocks(ctx, [shuffle.Block("w-other", "k", 1)], timeout_s=0.3))


def test_a_ctrl_c_d_job_s_reducer_stops_merging_its_inputs(tmp_path):
    # 8 map outputs of one pair (0, 1) each: the map side never calls `add`, the reducer
    # calls it once per block after the first. The first call waits for the test's gate;
    # the driver is Ctrl-C'd meanwhile. Before: the reducer merged all 8 blocks (7 calls).
    marks, gate = tmp_path / "marks", tmp_path / "go"
    marks.mkdir()

    def add(a, b):
        (marks / str(len(os.listdir(marks)))).touch()
        for _ in range(300):  # waits (at most 30 s) for the test's gate
            if gate.exists():
                break
            threading.Event().wait(0.1)
        return a + b

    main = threading.main_thread().ident
    with actorpy.connect(workers=1) as cluster:
        def interrupt_once_merging() -> None:
            wait_until(lambda: len(os.listdir(marks)) == 1, 60, "the reducer to merge")
            signal.pthread_kill(main, signal.SIGINT)
        interrupter = threading.Thread(target=interrupt_once_merging)
        interrupter.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                (mapre.from_items(cluster, [(0, 1)] * 8, partitions=8)
                 .reduce_by_key(add, partitions=1).collect(timeout_s=60))
        finally:
            interrupter.join(60)
            gate.touch()
        # one task thread: this runs once the given-up reducer has ended
        assert mapre.from_items(cluster, range(4), 1).count(timeout_s=60) == 4
    assert len(os.listdir(marks)) == 1

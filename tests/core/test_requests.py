"""Fail fast, never hang: unknown services answer, deadlines drop requests, mark_dead never
misses a request, ReplyFuture keeps the Future contract, undecodable results say why, a fast
sender waits instead of growing memory, and the tables stay bounded. In-process nodes."""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import os
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from actorpy.errors import (ActorpyError, ActorpyTimeout, ConfigError, NodeLost, RemoteError,
                            SerializationError)
from actorpy.ids import NodeId
from actorpy.runtime import directory
from actorpy.runtime import loop as loop_module
from actorpy.runtime.loop import SocketLoop
from actorpy.runtime.node import Node
from actorpy.wire import message as wm
from actorpy.wire.auth import Security, private_dir
from tests.conftest import wait_until

SVC, ECHO, FAIL, SILENT, VALUE = 7, 1, 2, 3, 4


@pytest.fixture
def pair():
    folder = private_dir()
    server = Node(NodeId("srv"), f"ipc://{folder}/srv", Security.ipc(), linger_ms=0).start()
    client = Node(NodeId("cli"), f"ipc://{folder}/cli", Security.ipc(), linger_ms=0).start()
    server.add_peer(NodeId("cli"), client.address, "driver")
    client.add_peer(NodeId("srv"), server.address, "worker")
    server.on(SVC, ECHO, lambda msg: server.reply(msg, msg.payload()))
    server.on(SVC, FAIL, lambda msg: server.reply_error(msg, ValueError("bad input")))
    server.on(SVC, SILENT, lambda msg: None)
    yield server, client, folder
    client.close()
    server.close()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def _bare_loop(next_tick):
    """A SocketLoop on a ROUTER of its own, its ticks recorded: ``(loop, ticks)``;
    ``next_tick(now)`` says when it next wants one."""
    ticks = []
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"inproc://router-{id(ticks)}")

    def tick(now):
        ticks.append(now)
        return next_tick(now)
    loop = SocketLoop(ctx, router, "test-loop", lambda: None, tick, lambda reason: None)
    loop.start()
    try:
        yield loop, ticks
    finally:
        loop.stop()
        loop.thread.join(10)
        router.close(linger=0)
        ctx.term()


class TestFailFast:
    def test_unknown_service_and_kind_get_an_error_reply_naming_them(self, pair):
        server, client, _ = pair
        t0 = time.monotonic()
        with pytest.raises(RemoteError, match="no service 99 on node srv"):
            client.call(NodeId("srv"), 99, ECHO, "hi", timeout_s=30)
        with pytest.raises(RemoteError, match="no handler for kind 15 of service 0"):
            client.call(NodeId("srv"), 0, 15, None, timeout_s=30)
        assert time.monotonic() - t0 < 10  # answered, not timed out

    def test_a_deadline_fails_and_drops_the_request_even_if_nobody_waits(self, pair):
        server, client, _ = pair
        fut = client.request(NodeId("srv"), SVC, SILENT, "no answer", timeout_s=0.2)
        wait_until(fut.done, 10, "the deadline to fail the request")
        assert isinstance(fut.exception(), ActorpyTimeout)
        assert len(client._requests) == 0
        assert client.call(NodeId("srv"), SVC, ECHO, 5, timeout_s=30) == 5

    @pytest.mark.parametrize("when", ["before", "after"])
    def test_mark_dead_never_misses_a_request_registered_beside_it(self, pair, when):
        server, client, _ = pair
        table = client._requests
        add = table.add

        def racing_add(fut, deadline=None):  # mark_dead lands right beside the registration
            if when == "before":
                client.mark_dead(NodeId("srv"), "raced")
            rid = add(fut, deadline)
            if when == "after":
                client.mark_dead(NodeId("srv"), "raced")
            return rid
        table.add = racing_add
        fut = client.request(NodeId("srv"), SVC, SILENT, "x")
        assert fut.done() and isinstance(fut.exception(), NodeLost)
        assert len(table) == 0

    def test_reply_future_keeps_the_future_contract(self, pair):
        server, client, _ = pair
        slow = client.request(NodeId("srv"), SVC, SILENT, "never")
        failing = client.request(NodeId("srv"), SVC, FAIL, "x")
        done, not_done = cf.wait([slow, failing], timeout=30, return_when=cf.FIRST_EXCEPTION)
        assert done == {failing} and not_done == {slow}
        error = failing.exception(0)
        assert isinstance(error, RemoteError) and error.remote_type == "ValueError"
        assert isinstance(error.__cause__, ValueError) and str(error.__cause__) == "bad input"
        with pytest.raises(RemoteError) as info:
            failing.result(0)
        assert info.value is error
        client.forget(slow)

    @pytest.mark.parametrize("direct", [False, True])
    def test_a_wait_longer_than_a_lock_can_wait_means_no_limit(self, pair, direct):
        # a lock waits at most threading.TIMEOUT_MAX (~292 years): past it, OverflowError
        server, client, _ = pair
        for timeout in (1e10, float("inf")):
            fut = client.request(NodeId("srv"), SVC, ECHO, "hi", direct=direct)
            assert fut.result(timeout) == "hi" and fut.exception(timeout) is None
            assert client.wait([fut], timeout) == {fut}
        fut = client.request(NodeId("srv"), SVC, ECHO, "hi", direct=direct)
        with pytest.raises(ConfigError, match="got nan"):
            fut.result(float("nan"))
        assert fut.result(30) == "hi"

    def test_a_deadline_months_away_is_waited_for(self, pair):
        # zmq_poll takes a C int of ms (24.8 days): a direct waiter's poll raised
        # OverflowError to the caller
        server, client, _ = pair
        fut = client.request(NodeId("srv"), SVC, ECHO, "direct", timeout_s=1e7, direct=True)
        assert fut.result(1e7) == "direct"

    def test_the_io_loop_waits_for_a_tick_months_away_quietly(self, caplog):
        # the loop's poll raised OverflowError (an ERROR, 100 ms of back-off) every other
        # round while a request's deadline was that far (Node.request(timeout_s=1e7))
        with _bare_loop(lambda now: now + 1e7) as (loop, ticks):
            wait_until(lambda: len(ticks) >= 1, 10, "the first tick")
            loop.wake()
            wait_until(lambda: len(ticks) >= 2, 10, "the tick after a wake-up")
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []

    def test_let_run_gives_a_loop_quiet_for_a_while_a_round(self):
        # a thread whose requests its own node answers on that thread never waits: it now
        # hands the loop a round when the loop has gone LET_RUN_AFTER_S without one
        with _bare_loop(lambda now: None) as (loop, ticks):   # no timer: polls until woken
            wait_until(lambda: len(ticks) >= 1, 10, "the first tick")
            began = time.monotonic()
            while time.monotonic() - began < 2 * loop_module.LET_RUN_AFTER_S:
                pass   # the loop polls, with nothing to do
            before = len(ticks)
            loop.let_run()   # wakes it (with no timer, nothing else would)
            wait_until(lambda: len(ticks) > before, 10, "the round let_run gave the loop")

    def test_an_undecodable_result_says_it_could_not_be_unpickled(self, pair, tmp_path):
        server, client, _ = pair
        (tmp_path / "only_on_the_worker.py").write_text("class Point:\n    x = 1\n")
        sys.path.insert(0, str(tmp_path))
        try:
            import only_on_the_worker
            server.on(SVC, VALUE, lambda msg: server.reply(msg, only_on_the_worker.Point()))
            fut = client.request(NodeId("srv"), SVC, VALUE, None)
            wait_until(fut.done, 10, "the reply")
        finally:
            sys.path.remove(str(tmp_path))
            sys.modules.pop("only_on_the_worker", None)
        with pytest.raises(SerializationError, match="could not be unpickled.*ModuleNotFoundError"):
            fut.result(0)


class TestBackpressure:
    def test_a_fast_sender_waits_and_the_io_thread_never_does(self):
        import zmq

        folder = private_dir()
        ctx = zmq.Context()
        stuck = ctx.socket(zmq.ROUTER)  # a peer that takes nothing until told to
        stuck.rcvhwm = 4
        stuck.linger = 0
        stuck.bind(f"ipc://{folder}/stuck")
        node = Node(NodeId("fast"), f"ipc://{folder}/fast", Security.ipc(), linger_ms=0,
                    send_hwm=4).start()
        try:
            node.add_peer(NodeId("stuck"), f"ipc://{folder}/stuck", "worker")
            n, size = 200, 256 << 10
            before = _rss()
            sender = threading.Thread(target=lambda: [
                node.send(NodeId("stuck"), SVC, ECHO, bytes([i % 256]) * size, step=i)
                for i in range(n)])
            sender.start()
            sender.join(2.0)
            assert sender.is_alive(), "the sender should wait for the stuck peer"
            assert _rss() - before < (n * size) // 3
            io_done = threading.Event()  # the I/O thread sends too, and is not held up
            node.call_later(0, lambda: ([node.send(NodeId("stuck"), SVC, ECHO, b"x" * size,
                                                   step=n + i) for i in range(20)],
                                        io_done.set()))
            assert io_done.wait(10)
            steps = []
            while len(steps) < n + 20:
                assert stuck.poll(10_000), f"only {len(steps)} messages arrived"
                frames = stuck.recv_multipart()
                steps.append(wm.Message.parse(frames[1:], 1 << 30).header.step)
            sender.join(10)
            assert not sender.is_alive()
            assert sorted(steps) == list(range(n + 20))
            mine = [s for s in steps if s < n]
            assert mine == sorted(mine)  # in order
        finally:
            node.close()
            stuck.close(linger=0)
            ctx.term()


class TestBounds:
    def test_parked_messages_are_capped(self, pair, monkeypatch):
        server, client, _ = pair
        monkeypatch.setattr(directory, "MAX_PARKED_PER_NODE", 3)
        for _ in range(3):
            client.send(NodeId("nobody"), SVC, ECHO, 1)
        with pytest.raises(ActorpyError, match="address is unknown"):
            client.send(NodeId("nobody"), SVC, ECHO, 1)
        assert client._dir.parked_count() == 3
        client.mark_dead(NodeId("nobody"))
        assert client._dir.parked_count() == 0

    def test_the_dead_are_remembered_up_to_a_bound(self, pair, monkeypatch):
        server, client, _ = pair
        monkeypatch.setattr(directory, "MAX_DEAD", 50)
        for i in range(80):
            client.mark_dead(NodeId(f"gone-{i}"))
        assert len(client._dir._dead) == 50
        assert not client.is_dead(NodeId("gone-0")) and client.is_dead(NodeId("gone-79"))

    def test_close_from_a_handler_and_with_a_request_pending(self, pair):
        server, client, folder = pair
        closed = threading.Event()
        server.on(SVC, 42, lambda msg: (server.close(), closed.set()))
        client.on(SVC, SILENT, lambda msg: None)
        pending = server.request(NodeId("cli"), SVC, SILENT, None)
        client.send(NodeId("srv"), SVC, 42)
        assert closed.wait(10)
        wait_until(lambda: not server._loop.running, 10, "the I/O thread to exit")
        assert isinstance(pending.exception(0), NodeLost)
        with pytest.raises(NodeLost, match="closed"):
            server.send(NodeId("cli"), SVC, ECHO, 1)


def test_a_message_to_this_node_copies_its_arrays_once(pair, monkeypatch):
    """A node's request to itself (a PS worker beside its shard) and the reply: each copied
    once, never snapshotted first nor cut into the wire's chunks and joined again (with a
    200 MB model a round trip made 5 copies where 2 do; the shard's process peaked at 7x
    the model). The copy is still made: the receiver never shares the sender's buffer."""
    server, _, _ = pair
    server.chunk_bytes = 1 << 20               # the array below is 4 chunks on the wire
    snapshots = []
    real = wm.Encoded.snapshot
    monkeypatch.setattr(wm.Encoded, "snapshot", lambda enc: snapshots.append(1) or real(enc))
    sent = np.arange(1 << 20, dtype=np.float32)
    back = server.call(NodeId("srv"), SVC, ECHO, sent, timeout_s=30)
    sent[0] = -1.0                             # the sender's array was not shared
    assert back[0] == 0.0 and np.array_equal(back[1:], sent[1:])
    assert snapshots == []
    owner = back        # backed by the loopback's copy (read-only, as a received frame),
    while isinstance(getattr(owner, "base", None), np.ndarray):   # not a join (writable)
        owner = owner.base
    assert isinstance(owner.base, memoryview) and owner.base.readonly
    assert owner.base.nbytes == sent.nbytes and not back.flags.writeable

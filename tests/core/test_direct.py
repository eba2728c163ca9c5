"""Direct replies (actorpy.runtime.direct): a thread's direct request answered by a handler
on the I/O thread comes back on the thread's own socket, never through its node's I/O
thread; a reply made on another thread, or one that cannot be routed back, comes the usual
way and still wakes the waiter; a lost node, a deadline or the node closing end the wait at
once; a message that
claims another sender on a thread's connection is dropped; under CURVE too. In-process
nodes on loopback."""
from __future__ import annotations

import threading
import time

import pytest
import zmq

from actorpy.errors import ActorpyTimeout, NodeLost, RemoteError
from actorpy.ids import NodeId
from actorpy.runtime import direct
from actorpy.runtime.node import Node
from actorpy.wire import header as hdr
from actorpy.wire import message as wm
from actorpy.wire.auth import Security, private_dir
from tests.conftest import wait_until

SVC, ECHO, LATER, SILENT, FAIL, ROUTES, LOST = 7, 1, 2, 3, 4, 5, 6
SRV, CLI, OTHER = NodeId("srv"), NodeId("cli"), NodeId("other")
SECRET = b"direct replies test secret, 32 b"


def _nodes(security: Security) -> list[Node]:
    if security.mode == "ipc":
        folder = private_dir()
        binds = [f"ipc://{folder}/{n}" for n in (SRV, CLI, OTHER)]
    else:
        binds = ["tcp://127.0.0.1:*"] * 3
    nodes = [Node(n, b, security, linger_ms=0).start() for n, b in zip((SRV, CLI, OTHER), binds)]
    for a in nodes:
        for b in nodes:
            if a is not b:
                a.add_peer(b.node_id, b.address, "worker")
    return nodes


@pytest.fixture(params=["ipc", "curve"])
def trio(request):
    security = Security.ipc() if request.param == "ipc" else Security.curve(SECRET)
    server, client, other = _nodes(security)
    routes: list[bytes | None] = []

    def later(msg: wm.Message) -> None:   # answered from another thread
        threading.Thread(target=lambda: server.reply(msg, msg.payload() * 2)).start()

    def unroutable(msg: wm.Message) -> None:   # as if the asking thread's socket were gone
        msg.route = b"cli" + direct.SEPARATOR + b"999"
        server.reply(msg, "by the link")

    def echo(msg: wm.Message) -> None:
        routes.append(msg.route)
        server.reply(msg, msg.payload())

    server.on(SVC, ECHO, echo)
    server.on(SVC, LATER, later)
    server.on(SVC, SILENT, lambda msg: None)
    server.on(SVC, FAIL, lambda msg: server.reply_error(msg, ValueError("bad input")))
    server.on(SVC, LOST, unroutable)
    yield server, client, other, routes
    for node in (client, other, server):
        node.close()


def test_a_direct_reply_reaches_the_waiting_thread_without_the_io_thread(trio):
    server, client, _, routes = trio
    client.call(SRV, SVC, ECHO, "warm up", timeout_s=30)   # links up, peers known
    before = client.bytes_in
    for i in range(20):
        fut = client.request(SRV, SVC, ECHO, i, direct=True, timeout_s=30)
        assert client.wait({fut}, 30) == {fut}
        assert fut.result(0) == i
    assert client.bytes_in == before   # nothing came in through the node's ROUTER
    assert routes[0] is None and all(r is not None and r.startswith(b"cli\0") for r in routes[1:])
    assert client._direct.sockets == 1


def test_result_on_the_sending_thread_reads_the_reply_itself(trio):
    server, client, _, _ = trio
    fut = client.request(SRV, SVC, ECHO, "x", direct=True, timeout_s=30)
    assert fut.result(30) == "x"
    with pytest.raises(RemoteError, match="bad input"):
        client.request(SRV, SVC, FAIL, None, direct=True, timeout_s=30).result(30)


def test_a_reply_from_another_thread_of_the_server_comes_over_the_link(trio):
    server, client, _, _ = trio
    fut = client.request(SRV, SVC, ECHO, 0, direct=True, timeout_s=30)
    fut.result(30)
    before = client.bytes_in
    fut = client.request(SRV, SVC, LATER, 21, direct=True, timeout_s=30)
    assert client.wait([fut], 30) == {fut}   # the I/O thread resolved it and woke us
    assert fut.result(0) == 42
    assert client.bytes_in > before


def test_an_unroutable_reply_comes_over_the_link_and_wakes_the_waiter(trio):
    server, client, _, _ = trio
    client.request(SRV, SVC, ECHO, 0, direct=True, timeout_s=30).result(30)
    before = client.bytes_in
    fut = client.request(SRV, SVC, LOST, None, direct=True, timeout_s=30)
    assert client.wait({fut}, 30) == {fut}
    assert fut.result(0) == "by the link"
    assert client.bytes_in > before   # it came through the ROUTER


def test_waiting_on_several_nodes_returns_the_first_reply(trio):
    server, client, other, _ = trio
    other.on(SVC, ECHO, lambda msg: other.reply(msg, ("other", msg.payload())))
    silent = client.request(SRV, SVC, SILENT, None, direct=True, timeout_s=30)
    answered = client.request(OTHER, SVC, ECHO, 1, direct=True, timeout_s=30)
    assert client.wait([silent, answered], 30) == {answered}
    assert answered.result(0) == ("other", 1)
    assert client._direct.sockets == 2
    t0 = time.monotonic()
    assert client.wait([silent], 0.2) == set()   # the time runs out: nothing done
    assert 0.15 < time.monotonic() - t0 < 10


def test_a_lost_node_ends_the_wait_at_once(trio):
    server, client, other, _ = trio
    fut = client.request(SRV, SVC, SILENT, None, direct=True, timeout_s=60)
    timer = threading.Timer(0.3, lambda: client.mark_dead(SRV, "killed"))
    timer.start()
    t0 = time.monotonic()
    assert client.wait({fut}, 60) == {fut}
    assert time.monotonic() - t0 < 10
    with pytest.raises(NodeLost, match="killed"):
        fut.result(0)
    timer.join()
    # The next direct request of this thread closes its socket to the dead node.
    other.on(SVC, ECHO, lambda msg: other.reply(msg, msg.payload()))
    assert client.request(OTHER, SVC, ECHO, 3, direct=True, timeout_s=30).result(30) == 3
    assert client._direct.sockets == 1


def test_a_deadline_ends_the_wait(trio):
    server, client, _, _ = trio
    fut = client.request(SRV, SVC, SILENT, None, direct=True, timeout_s=0.3)
    with pytest.raises(ActorpyTimeout):
        fut.result(30)


def test_closing_the_node_ends_a_wait_and_closes_its_sockets(trio):
    server, client, _, _ = trio
    fut = client.request(SRV, SVC, SILENT, None, direct=True, timeout_s=60)
    closer = threading.Timer(0.3, client.close)
    closer.start()
    t0 = time.monotonic()
    with pytest.raises(NodeLost):
        fut.result(60)
    assert time.monotonic() - t0 < 10
    closer.join()
    wait_until(lambda: client._direct.sockets == 0, 10, "the thread sockets to close")
    assert not client._loop.running


def test_a_thread_connection_claiming_another_sender_is_dropped(trio, caplog):
    server, client, _, routes = trio
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    server.security.apply_client(sock)   # a member (under CURVE: holds the key)
    sock.setsockopt(zmq.IDENTITY, b"evil" + direct.SEPARATOR + b"1")
    sock.connect(server.address)
    try:
        with caplog.at_level("WARNING"):
            sock.send_multipart(wm.assemble(SVC, ECHO, "cli", "forged", request_id=77))
            wait_until(lambda: "claims to come from 'cli'" in caplog.text, 10,
                       "the forged message to be dropped")
        assert all(r is None or r.startswith(b"cli\0") for r in routes)
        assert not sock.poll(200)   # nothing was answered
    finally:
        sock.close()


def test_only_replies_are_taken_from_a_thread_socket(trio, caplog):
    server, client, _, _ = trio
    assert client.request(SRV, SVC, ECHO, 0, direct=True, timeout_s=30).result(30) == 0
    route = hdr.sender_bytes(CLI) + direct.SEPARATOR + b"1"   # the first thread socket
    stray = wm.assemble(SVC, ECHO, "srv", "not a reply", request_id=1)
    sent = threading.Event()

    def send_stray() -> None:   # the server's I/O thread owns its ROUTER
        server._router.send_multipart([route, *stray])
        sent.set()
    server.call_later(0, send_stray)
    assert sent.wait(10)
    with caplog.at_level("WARNING"):
        fut = client.request(SRV, SVC, LATER, 1, direct=True, timeout_s=30)
        assert fut.result(30) == 2
    assert "only replies come that way" in caplog.text


def test_split_route():
    assert direct.split_route(b"w-1") == (b"w-1", False)
    assert direct.split_route(b"w-1\x0012") == (b"w-1", True)

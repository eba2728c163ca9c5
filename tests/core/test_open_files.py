"""How many sockets a node may hold, and which limit an out-of-sockets error names.

A manager spends 3 ZeroMQ sockets per member (its link, the link's monitor and libzmq's end
of it). Its context was left at libzmq's default of 1023 sockets, so a standalone manager
refused its 339th member (workers and drivers together) with "Too many open files (raise
the open-files limit, `ulimit -n`)", whatever that limit was (found with 20 000 of it, 1 719
used).
"""
from __future__ import annotations

import resource

import pytest
import zmq

from actorpy.errors import ActorpyError
from actorpy.ids import NodeId
from actorpy.runtime import files
from actorpy.runtime import node as node_module
from actorpy.runtime.node import Node
from actorpy.wire.auth import Security

SECRET = b"open files test secret, 32 bytes"
#: nobody listens there (the links keep dialling; what counts here is that they open)
NOWHERE = "tcp://127.0.0.1:52917"
MEMBERS = 400


@pytest.fixture
def manager():
    node = Node(NodeId("mgr"), "tcp://127.0.0.1:*", Security.curve(SECRET), linger_ms=0)
    yield node.start()
    node.close()


def _watch(node: Node, count: int) -> None:
    for i in range(count):
        node._dir.add_peer(NodeId(f"w-{i}"), NOWHERE, "worker", watch=True)


def test_a_node_context_holds_as_many_sockets_as_the_open_files_limit(manager):
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = manager._ctx.get(zmq.SOCKET_LIMIT)
    want = ceiling if soft == resource.RLIM_INFINITY else max(1023, min(soft, ceiling))
    assert manager._ctx.get(zmq.MAX_SOCKETS) == want


def test_a_manager_links_to_more_than_340_watched_members():
    try:   # 3 sockets and a descriptor or two per member; a low soft limit is raised
        files.ensure_open_files(4096, "this test")
    except Exception as exc:   # noqa: BLE001 - a hard limit below it
        pytest.skip(str(exc))
    node = Node(NodeId("mgr"), "tcp://127.0.0.1:*", Security.curve(SECRET), linger_ms=0)
    try:
        node.start()
        _watch(node, MEMBERS)
        assert node._dir.link_count() == MEMBERS
    finally:
        node.close()


def test_a_full_context_names_its_socket_limit_not_the_open_files_limit(monkeypatch):
    monkeypatch.setattr(node_module, "size_context", lambda ctx: ctx.set(zmq.MAX_SOCKETS, 40))
    node = Node(NodeId("mgr"), "tcp://127.0.0.1:*", Security.curve(SECRET), linger_ms=0)
    try:
        node.start()
        with pytest.raises(ActorpyError) as caught:
            _watch(node, 40)
    finally:
        node.close()
    text = str(caught.value)
    assert "maximum of 40 sockets" in text and "ZMQ_MAX_SOCKETS" in text, text
    assert "no file descriptor left" not in text


def test_out_of_descriptors_names_the_open_files_limit(monkeypatch):
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        pytest.skip("no open-files limit")
    monkeypatch.setattr(files, "_open_files", lambda: soft - 1)
    ctx = zmq.Context()
    try:
        text = files.no_socket_hint(ctx)
    finally:
        ctx.term()
    assert "no file descriptor left" in text and "ulimit -n" in text, text
    assert "ZMQ_MAX_SOCKETS" not in text

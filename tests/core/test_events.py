"""Membership events (joined / left / dead, unsubscribe, a failing listener) and
cancellable timers, on real processes and in-process nodes."""
from __future__ import annotations

import os
import signal
import threading

import pytest

import actorpy
from actorpy.ids import NodeId
from actorpy.runtime.node import Node, NodeEvent, NodeEventKind
from actorpy.wire.auth import Security, private_dir
from tests.conftest import wait_until


def _node(name: str, folder: str) -> Node:
    return Node(NodeId(name), f"ipc://{folder}/{name}", Security.ipc(), linger_ms=0).start()


def test_timer_cancel_and_order(tmp_path):
    folder = private_dir()
    node = _node("t", folder)
    try:
        fired: list[str] = []
        done = threading.Event()
        node.call_later(0.05, lambda: fired.append("late"))
        doomed = node.call_later(0.01, lambda: fired.append("cancelled"))
        node.call_later(0.0, lambda: fired.append("first"))
        doomed.cancel()
        node.call_later(0.1, done.set)
        assert done.wait(5)
        assert fired == ["first", "late"]
    finally:
        node.close()


def test_events_joined_dead_left_and_unsubscribe():
    folder = private_dir()
    node = _node("e", folder)
    try:
        seen: list[tuple[NodeEventKind, str, str]] = []
        sub = node.subscribe(lambda ev: seen.append((ev.kind, ev.node_id, ev.role)))

        def broken(ev: NodeEvent) -> None:
            raise RuntimeError("listener bug")
        node.subscribe(broken)  # must not stop the first listener
        node.add_peer(NodeId("a"), f"ipc://{folder}/a", "worker", slots=4)
        node.add_peer(NodeId("a"), f"ipc://{folder}/a", "worker", slots=4)  # known: no event
        node.add_peer(NodeId("b"), f"ipc://{folder}/b", "driver")
        node.mark_dead(NodeId("a"), "killed")
        node.mark_dead(NodeId("b"), "bye", left=True)
        node.mark_dead(NodeId("b"), "again", left=True)  # already gone: no event
        sub.cancel()
        node.add_peer(NodeId("c"), f"ipc://{folder}/c", "worker")
        assert seen == [(NodeEventKind.JOINED, "a", "worker"),
                        (NodeEventKind.JOINED, "b", "driver"),
                        (NodeEventKind.DEAD, "a", "worker"), (NodeEventKind.LEFT, "b", "driver")]
        assert node.peer(NodeId("a")).slots == 4
    finally:
        node.close()


def _state(pid: int) -> str:
    """A process's state letter (Z: a zombie), or "" once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return ""


def test_cluster_reports_joins_with_slots_and_a_killed_worker():
    with actorpy.connect(workers=2, dead_after_s=2.0) as cluster:
        events: list[NodeEvent] = []
        gone = threading.Event()

        def listen(ev: NodeEvent) -> None:
            events.append(ev)
            if ev.kind is NodeEventKind.DEAD:
                gone.set()
        cluster.subscribe(listen)
        assert all(cluster.node.peer(w).slots == 1 for w in cluster.workers())
        victim = cluster.workers()[0]
        pid = next(r["pid"] for r in cluster.nodes() if r["node_id"] == victim)
        os.kill(pid, signal.SIGKILL)
        assert gone.wait(10), "the killed worker was never declared dead"
        dead = [e for e in events if e.kind is NodeEventKind.DEAD]
        assert [(e.node_id, e.role) for e in dead] == [(victim, "worker")]
        wait_until(lambda: victim not in cluster.workers(), 5, "the directory to drop the victim")
        # its exit status collected once it was declared dead: before, it stayed a zombie
        # under the driver until the cluster closed
        wait_until(lambda: _state(pid) != "Z", 5, "the killed worker to be reaped")
        other = cluster.workers()[0]
        os.kill(next(r["pid"] for r in cluster.nodes() if r["node_id"] == other),
                signal.SIGKILL)
        wait_until(lambda: not cluster.workers(), 10, "the other worker to be declared dead")
        with pytest.raises(actorpy.NodeLost, match=r"no live workers in this cluster; start "
                                                   r"more with cluster.add_workers\(n\)"):
            cluster.submit(pow, 2, 2)   # before: no word of add_workers

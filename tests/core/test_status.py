"""The manager's records of gone members, and how `actorpy status` shows them.

A standing cluster sees one driver per job come and leave: after 1 000 of them (the
manager keeps MAX_GONE_RECORDS) a killed worker's record, with the reason it died, had been
pushed out by drivers that left cleanly, and `actorpy status` printed 1 003 lines.
"""
from __future__ import annotations

import argparse
import time

import pytest

from actorpy import cli
from actorpy.config import Config
from actorpy.runtime import manager as manager_module
from actorpy.runtime import node as node_module
from actorpy.runtime.manager import Manager, NodeRecord
from actorpy.wire.auth import Security, private_dir


@pytest.fixture
def manager():
    folder = private_dir()
    mgr = Manager(f"ipc://{folder}/manager", Security.ipc(), Config())   # not started:
    yield mgr                                                             # no sweep runs
    mgr.node.close()


def _gone(mgr: Manager, node_id: str, role: str, state: str, reason: str) -> None:
    rec = NodeRecord(node_id, role, f"ipc:///nowhere/{node_id}", "host", 1, 1, "alive",
                     time.time(), time.monotonic())
    mgr.records[node_id] = rec
    mgr._declare(rec, state, reason)


def test_drivers_that_left_do_not_push_out_a_dead_workers_record(manager, monkeypatch):
    monkeypatch.setattr(manager_module, "MAX_GONE_RECORDS", 10)
    _gone(manager, "w-killed", "worker", "dead", "connection lost (killed)")
    _gone(manager, "w-stopped", "worker", "left", "left the cluster")
    for i in range(30):
        _gone(manager, f"d-{i}", "driver", "left", "left the cluster")
    kept = manager.records
    assert kept["w-killed"].reason == "connection lost (killed)"
    assert "w-stopped" in kept
    assert len(kept) == 10 and [f"d-{i}" for i in range(22, 30)] == list(kept)[2:]
    for i in range(20):   # dead members beyond the bound: the oldest goes, drivers first
        _gone(manager, f"w-{i}", "worker", "dead", "connection lost")
    assert list(kept) == [f"w-{i}" for i in range(10, 20)]


class _Node:
    """Stands in for the status command's node: answers LIST_NODES with ``rows``."""
    rows: list[dict] = []
    address = "ipc:///status"

    def __init__(self, *args, **kwargs) -> None:
        pass

    def start(self) -> _Node:
        return self

    def add_peer(self, *args, **kwargs) -> None:
        pass

    def call(self, *args, **kwargs) -> list[dict]:
        return self.rows

    def close(self, *args, **kwargs) -> None:
        pass


def _row(node_id: str, role: str, state: str, joined_at: float, reason: str = "") -> dict:
    return {"node_id": node_id, "role": role, "address": "ipc:///x", "host": "h", "pid": 1,
            "slots": 1, "state": state, "joined_at": joined_at, "reason": reason,
            "heartbeat_age_s": 1.0}


def test_status_summarises_drivers_that_left(monkeypatch, capsys):
    rows = [_row("w-alive", "worker", "alive", 0.0),
            _row("w-dead", "worker", "dead", 1.0, "connection lost")]
    rows += [_row(f"d-{i:04d}", "driver", "left", 2.0 + i, "left the cluster")
             for i in range(1000)]
    monkeypatch.setattr(node_module, "Node", type("Node", (_Node,), {"rows": rows}))
    args = argparse.Namespace(manager=f"ipc://{private_dir()}/manager", secret_file=None,
                              timeout_s=5.0, json=False)
    assert cli.cmd_status(args) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].endswith(": 1 alive, 1001 gone"), lines[0]
    assert "w-alive" in out and "w-dead" in out and "(connection lost)" in out
    assert len(lines) < 20, len(lines)   # was 1 003 lines
    shown = [line.split()[0] for line in lines if line.startswith("d-")]
    assert shown == [f"d-{i:04d}" for i in range(1000 - cli.SHOWN_LEFT_DRIVERS, 1000)]
    assert f"{1000 - cli.SHOWN_LEFT_DRIVERS} more drivers that left cleanly" in out
    args.json = True   # --json still has every row
    assert cli.cmd_status(args) == 0
    assert capsys.readouterr().out.count('"left"') == 1000

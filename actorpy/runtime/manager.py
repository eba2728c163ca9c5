"""The manager: registry of nodes, heartbeats and failure detection. It never runs user code
(it unpickles only its own small control payloads, and only from authenticated members)."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass

from actorpy.config import Config
from actorpy.errors import ConfigError
from actorpy.ids import NodeId
from actorpy.runtime.address import is_endpoint
from actorpy.runtime.membership import MANAGER_ID
from actorpy.runtime.names import NameRegistry
from actorpy.runtime.node import Node
from actorpy.wire import message as wm
from actorpy.wire.auth import Security
from actorpy.wire.kinds import CORE_SERVICE, Kind

log = logging.getLogger(__name__)


@dataclass
class NodeRecord:
    node_id: str
    role: str
    address: str
    host: str
    pid: int
    slots: int
    state: str           # "alive", "dead" or "left"
    joined_at: float     # wall-clock seconds (for display)
    last_seen: float     # monotonic seconds
    reason: str = ""


class Manager:
    """Serve a cluster's registry at ``bind`` until ``stop()``.

    Args:
        bind: endpoint, e.g. ``tcp://0.0.0.0:7400`` (with a CURVE Security) or ``ipc://…``.
        security: from actorpy.wire.auth.
        config: heartbeat_interval_s and dead_after_s bound failure detection.
    """

    def __init__(self, bind: str, security: Security, config: Config) -> None:
        self.config = config
        self.node = Node.from_config(MANAGER_ID, bind, security, config)
        self.records: dict[str, NodeRecord] = {}
        self.stopped = threading.Event()
        on = self.node.on
        on(CORE_SERVICE, Kind.REGISTER, self._register)
        on(CORE_SERVICE, Kind.HEARTBEAT, self._heartbeat)
        on(CORE_SERVICE, Kind.LIST_NODES, self._list)
        on(CORE_SERVICE, Kind.LEAVE, self._leave)
        on(CORE_SERVICE, Kind.LOOKUP, self._lookup)
        self.names = NameRegistry(self.node)  # service names (runtime/names.py)

    @property
    def address(self) -> str:
        return self.node.address

    def start(self) -> Manager:
        self.node.start()
        self.node.call_later(self.config.heartbeat_interval_s, self._sweep)
        log.info("manager listening at %s", self.address)
        return self

    def stop(self, tell_nodes: bool = True) -> None:
        """Stop serving; with ``tell_nodes`` every live node is told to shut down first."""
        if self.stopped.is_set():
            return
        if tell_nodes:
            for rec in self._alive():
                self.node.send(NodeId(rec.node_id), CORE_SERVICE, Kind.SHUTDOWN)
        self.stopped.set()
        self.node.close()

    def _alive(self) -> list[NodeRecord]:
        return [r for r in self.records.values() if r.state == "alive"]

    def _register(self, msg: wm.Message) -> None:
        info = msg.payload()
        if not isinstance(info, dict) or not is_endpoint(info.get("address")):
            log.warning("ignored a registration from %s: no valid address in %r", msg.sender,
                        info if not isinstance(info, dict) else info.get("address"))
            return
        node_id = NodeId(msg.sender)
        slots = info.get("slots", 1)
        if not isinstance(slots, int) or not 1 <= slots <= 4096:
            log.warning("ignored a registration from %s: bad slots %r", msg.sender, slots)
            return
        try:
            self.node.add_peer(node_id, info["address"], str(info.get("role", "worker")), slots)
        except ConfigError as exc:
            log.warning("ignored a registration from %s: %s", msg.sender, exc)
            return
        rec = NodeRecord(node_id, str(info.get("role", "worker")), info["address"],
                         str(info.get("host", "")), int(info.get("pid", 0)),
                         slots, "alive", time.time(), time.monotonic())
        for other in self._alive():
            if other.node_id != node_id:
                self.node.send(NodeId(other.node_id), CORE_SERVICE, Kind.NODE_JOINED,
                               (node_id, rec.address, rec.role, rec.slots))
        self.records[node_id] = rec
        log.info("%s %s joined from %s (pid %d)", rec.role, node_id, rec.host, rec.pid)
        self.node.reply(msg, [(r.node_id, r.address, r.role, r.slots) for r in self._alive()])

    def _heartbeat(self, msg: wm.Message) -> None:
        rec = self.records.get(msg.sender)
        if rec is None:
            return  # never registered: nothing to acknowledge
        if rec.state != "alive":
            # Declared dead already and its work handed on: no acknowledgement, so a node
            # that was only paused finds its heartbeats unanswered and exits by itself.
            return
        rec.last_seen = time.monotonic()
        self.node.send(NodeId(msg.sender), CORE_SERVICE, Kind.HEARTBEAT_ACK)

    def _list(self, msg: wm.Message) -> None:
        info = msg.payload()
        visitor = msg.sender not in self.records
        if visitor:  # e.g. `actorpy status`: reachable for this one reply only
            if not isinstance(info, dict) or not is_endpoint(info.get("address")):
                log.warning("ignored a node list request from %s: no valid address", msg.sender)
                return
            try:
                self.node.add_peer(NodeId(msg.sender), info["address"], "client")
            except ConfigError as exc:
                log.warning("ignored a node list request from %s: %s", msg.sender, exc)
                return
        now = time.monotonic()
        rows = []
        for rec in self.records.values():
            row = asdict(rec)
            row["heartbeat_age_s"] = round(now - rec.last_seen, 3)
            del row["last_seen"]
            rows.append(row)
        self.node.reply(msg, rows)
        if visitor:
            self.node.forget_peer(NodeId(msg.sender))

    def _lookup(self, msg: wm.Message) -> None:
        rec = self.records.get(msg.payload())
        self.node.reply(msg, (rec.address, rec.role, rec.slots) if rec and rec.state == "alive"
                        else None)

    def _leave(self, msg: wm.Message) -> None:
        rec = self.records.get(msg.sender)
        if rec is not None and rec.state == "alive":
            self._declare(rec, "left", "left the cluster")

    def _sweep(self) -> None:
        if self.stopped.is_set():
            return
        now = time.monotonic()
        for rec in self._alive():
            if now - rec.last_seen > self.config.dead_after_s:
                self._declare(rec, "dead", f"no heartbeat for {now - rec.last_seen:.1f} s")
        self.node.call_later(self.config.heartbeat_interval_s, self._sweep)

    def _declare(self, rec: NodeRecord, state: str, reason: str) -> None:
        rec.state, rec.reason = state, reason
        level = logging.WARNING if state == "dead" else logging.INFO
        log.log(level, "%s %s is %s: %s", rec.role, rec.node_id, state, reason)
        self.node.mark_dead(NodeId(rec.node_id), reason, left=state == "left")
        for other in self._alive():
            self.node.send(NodeId(other.node_id), CORE_SERVICE, Kind.NODE_DEAD,
                           (rec.node_id, reason, state))

"""The manager: registry of nodes, heartbeats and failure detection. It never runs user code
(it unpickles only its own small control payloads, and only from authenticated members).

Failure detection follows ``actorpy.runtime.liveness``: the manager watches its link to
every member (ZMTP heartbeats and a socket monitor, in libzmq's C thread). A member whose
link stays down is dead; one that only stops heartbeating (a task holding its GIL) is
*suspect* until it speaks again, and dead only after ``silent_dead_after_s``.

A registered node is *joining* until the manager's link to it is up and it has heartbeated
(so it holds its directory): only then is it announced (NODE_JOINED) and listed to others,
so nobody sends work to a node that cannot be reached yet.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass

from actorpy.config import MAX_TASK_THREADS, Config
from actorpy.errors import ConfigError, NodeLost
from actorpy.ids import NodeId
from actorpy.log import Throttle, brief
from actorpy.runtime.address import is_endpoint
from actorpy.runtime.liveness import LivenessTimes, StallGuard, judge
from actorpy.runtime.membership import MANAGER_ID
from actorpy.runtime.names import NameRegistry
from actorpy.runtime.node import Node, decode_payload
from actorpy.wire import message as wm
from actorpy.wire.auth import Security
from actorpy.wire.kinds import CORE_SERVICE, Kind

log = logging.getLogger(__name__)
#: a member's malformed requests: one line per sender and cause per 10 s (a buggy client
#: looping on one must not flood the log)
_DROPS = Throttle()

#: records of dead or departed nodes kept for `actorpy status`: drivers that left cleanly
#: are dropped first (oldest first; one per job on a standing cluster), so that they do not
#: push out a dead member's record and its reason; then the oldest of the others
MAX_GONE_RECORDS = 1000
MEMBER_STATES = ("joining", "alive", "suspect")


@dataclass
class NodeRecord:
    node_id: str
    role: str
    address: str
    host: str
    pid: int
    slots: int
    state: str           # "joining", "alive", "suspect", "dead" or "left"
    joined_at: float     # wall-clock seconds (for display)
    last_seen: float     # monotonic seconds
    reason: str = ""
    heartbeated: bool = False  # has heartbeated since it registered (it holds its directory)


class Manager:
    """Serve a cluster's registry at ``bind`` until ``stop()``.

    Args:
        bind: endpoint, e.g. ``tcp://0.0.0.0:7400`` (with a CURVE Security) or ``ipc://…``.
        security: from actorpy.wire.auth.
        config: heartbeat_interval_s, dead_after_s and silent_dead_after_s bound failure
            detection.
    """

    def __init__(self, bind: str, security: Security, config: Config) -> None:
        self.config = config
        self.times = LivenessTimes.of(config.heartbeat_interval_s, config.dead_after_s,
                                      config.silent_dead_after_s)
        self.node = Node.from_config(MANAGER_ID, bind, security, config)
        #: owned by the I/O thread (read it from a handler or a timer)
        self.records: dict[str, NodeRecord] = {}
        self._gone: deque[str] = deque()    # dead members, workers that left
        self._left: deque[str] = deque()    # drivers that left cleanly (dropped first)
        self.stopped = threading.Event()
        #: why the manager stopped on its own ("" for a requested stop)
        self.failure = ""
        self._stall = StallGuard(config.heartbeat_interval_s, time.monotonic())
        on = self.node.on
        on(CORE_SERVICE, Kind.REGISTER, self._register)
        on(CORE_SERVICE, Kind.HEARTBEAT, self._heartbeat)
        on(CORE_SERVICE, Kind.LIST_NODES, self._list)
        on(CORE_SERVICE, Kind.LEAVE, self._leave)
        on(CORE_SERVICE, Kind.LOOKUP, self._lookup)
        self.names = NameRegistry(self.node)  # service names (runtime/names.py)
        self.node.on_fatal(self._failed)
        self.node.on_link_up(self._link_up)

    @property
    def address(self) -> str:
        return self.node.address

    def start(self) -> Manager:
        self.node.start()
        self.node.call_later(self.config.heartbeat_interval_s, self._sweep)
        log.info("manager listening at %s", self.address)
        return self

    def stop(self, tell_nodes: bool = True) -> None:
        """Stop serving; with ``tell_nodes`` every live node is told to shut down first.
        Safe from any thread (a signal handler included): the records are read on the I/O
        thread, which owns them."""
        if self.stopped.is_set():
            return
        if tell_nodes and not self.node.closed:
            told = threading.Event()

            def tell() -> None:
                for rec in self._members():
                    self.node.send(NodeId(rec.node_id), CORE_SERVICE, Kind.SHUTDOWN)
                told.set()
            if self.node.in_io_thread():
                tell()
            else:
                self.node.call_later(0, tell)
                told.wait(5)
        self.stopped.set()
        self.node.close()

    def _failed(self, reason: str) -> None:
        self.failure = reason
        self.stopped.set()

    def _members(self) -> list[NodeRecord]:
        return [r for r in self.records.values() if r.state in MEMBER_STATES]

    def _register(self, msg: wm.Message) -> None:
        info = decode_payload(msg, "a registration")
        if not isinstance(info, dict) or not is_endpoint(info.get("address")):
            _DROPS.log(log, (msg.sender, "registration address"), "ignored a registration "
                       "from %s: no valid address in %s", msg.sender,
                       brief(info if not isinstance(info, dict) else info.get("address")))
            return
        node_id = NodeId(msg.sender)
        slots = info.get("slots", 1)
        if not isinstance(slots, int) or not 1 <= slots <= MAX_TASK_THREADS:
            _DROPS.log(log, (msg.sender, "registration slots"), "ignored a registration "
                       "from %s: bad slots %s", msg.sender, brief(slots))
            return
        role = str(info.get("role", "worker"))
        try:
            self.node.add_peer(node_id, info["address"], role, slots, watch=True)
        except ConfigError as exc:
            _DROPS.log(log, (msg.sender, "registration refused"),
                       "ignored a registration from %s: %s", msg.sender, exc)
            return
        pid = info.get("pid", 0)
        rec = NodeRecord(node_id, role, info["address"], str(info.get("host", "")),
                         pid if isinstance(pid, int) else 0, slots, "joining", time.time(),
                         time.monotonic())
        self.records.pop(node_id, None)  # a node registering again starts a fresh record
        self.records[node_id] = rec
        self.node.reply(msg, [(r.node_id, r.address, r.role, r.slots)
                              for r in self._members() if r.state != "joining"])

    def _admit(self, rec: NodeRecord) -> None:
        """A joining node is reachable and has its directory: announce it."""
        rec.state = "alive"
        log.info("%s %s joined from %s (pid %d)", rec.role, rec.node_id, rec.host, rec.pid)
        for other in self._members():
            if other.node_id != rec.node_id:
                self.node.send(NodeId(other.node_id), CORE_SERVICE, Kind.NODE_JOINED,
                               (rec.node_id, rec.address, rec.role, rec.slots))

    def _link_up(self, node_id: NodeId) -> None:
        """Our link to a node came up: a joining node whose first heartbeat came before it
        is admitted now, not at its next heartbeat (a quarter of a second later)."""
        rec = self.records.get(node_id)
        if rec is not None and rec.state == "joining" and rec.heartbeated:
            self._admit(rec)

    def _heartbeat(self, msg: wm.Message) -> None:
        rec = self.records.get(msg.sender)
        if rec is None or rec.state not in MEMBER_STATES:
            # Never registered, or declared dead already and its work handed on: no
            # acknowledgement, so a node that was only paused finds its heartbeats
            # unanswered and exits by itself.
            return
        if rec.state == "suspect":
            log.info("%s %s is heartbeating again", rec.role, rec.node_id)
            rec.state, rec.reason = "alive", ""
        rec.last_seen = time.monotonic()
        rec.heartbeated = True
        if rec.state == "joining" and self.node.link_ever_up(NodeId(rec.node_id)):
            self._admit(rec)
        self.node.send(NodeId(msg.sender), CORE_SERVICE, Kind.HEARTBEAT_ACK)

    def _list(self, msg: wm.Message) -> None:
        info = decode_payload(msg, "a node list request")
        visitor = msg.sender not in self.records
        if visitor:  # e.g. `actorpy status`: reachable for this one reply only
            if not isinstance(info, dict) or not is_endpoint(info.get("address")):
                _DROPS.log(log, (msg.sender, "list address"), "ignored a node list request "
                           "from %s: no valid address", msg.sender)
                return
            try:
                self.node.add_peer(NodeId(msg.sender), info["address"], "client")
            except ConfigError as exc:
                _DROPS.log(log, (msg.sender, "list refused"),
                           "ignored a node list request from %s: %s", msg.sender, exc)
                return
        now = time.monotonic()
        rows = []
        for rec in self.records.values():
            row = asdict(rec)
            row["heartbeat_age_s"] = round(now - rec.last_seen, 3)
            del row["last_seen"], row["heartbeated"]
            rows.append(row)
        self.node.reply(msg, rows)
        if visitor:
            self.node.forget_peer(NodeId(msg.sender))

    def _lookup(self, msg: wm.Message) -> None:
        key = decode_payload(msg, "a lookup")
        rec = self.records.get(key) if isinstance(key, str) else None
        self.node.reply(msg, (rec.address, rec.role, rec.slots)
                        if rec and rec.state in MEMBER_STATES else None)

    def _leave(self, msg: wm.Message) -> None:
        rec = self.records.get(msg.sender)
        if rec is not None and rec.state in MEMBER_STATES:
            self._declare(rec, "left", "left the cluster")

    def _sweep(self) -> None:
        if self.stopped.is_set():
            return
        now = time.monotonic()
        stalled = self._stall.tick(now)
        for rec in self._members():
            if stalled:  # our loop could not listen meanwhile: nobody was silent
                rec.last_seen += stalled
            node_id = NodeId(rec.node_id)
            down = self.node.link_down_for(node_id) or 0.0
            state, reason = judge(now - rec.last_seen, down, self.times,
                                  self.node.link_ever_up(node_id))
            if state == "dead":
                self._declare(rec, "dead", reason)
            elif rec.state == "joining":
                continue  # admitted by its first heartbeat once our link to it is up
            elif state == "suspect" and rec.state == "alive":
                log.warning("%s %s is suspect: %s", rec.role, rec.node_id, reason)
                rec.state, rec.reason = "suspect", reason
        self.node.call_later(self.config.heartbeat_interval_s, self._sweep)

    def _declare(self, rec: NodeRecord, state: str, reason: str) -> None:
        rec.state, rec.reason = state, reason
        level = logging.WARNING if state == "dead" else logging.INFO
        log.log(level, "%s %s is %s: %s", rec.role, rec.node_id, state, reason)
        self.node.mark_dead(NodeId(rec.node_id), reason, left=state == "left")
        try:
            for other in self._members():
                self.node.send(NodeId(other.node_id), CORE_SERVICE, Kind.NODE_DEAD,
                               (rec.node_id, reason, state))
        except NodeLost:
            # stopped as it announced this (the workers of a `systemctl stop` leave as their
            # manager stops): the members were told to shut down. Before: an ERROR and a
            # traceback in the manager's log
            if not self.node.closed:
                raise
        clean = state == "left" and rec.role == "driver"
        (self._left if clean else self._gone).append(rec.node_id)
        while len(self._gone) + len(self._left) > MAX_GONE_RECORDS:
            old = (self._left or self._gone).popleft()
            stale = self.records.get(old)
            if stale is not None and stale.state not in MEMBER_STATES:
                del self.records[old]


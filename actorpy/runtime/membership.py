"""A node's membership in a cluster: register with the manager, keep the directory of peers
current, heartbeat, and notice when the manager is gone. Workers and drivers share it.

The link to the manager is *watched* (ZMTP heartbeats and a socket monitor, run by libzmq
without the GIL): the manager is gone when that connection has been down for
``manager_timeout_s``, or when it has not answered our heartbeats for that long while our own
loop was running (a node the manager declared dead gets no answers: that is how a node that
was only paused is fenced off). A task holding the GIL stalls our loop, not the manager: the
stalled stretch is not counted (``liveness.StallGuard``).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from actorpy.config import Config
from actorpy.errors import ActorpyError, ActorpyTimeout, AuthError, NodeLost, ProtocolError
from actorpy.ids import NodeId
from actorpy.log import Throttle
from actorpy.runtime.address import secret_error
from actorpy.runtime.liveness import StallGuard, Verdict
from actorpy.runtime.node import Node, decode_payload
from actorpy.wire import message as wm
from actorpy.wire.kinds import CORE_SERVICE, Kind

log = logging.getLogger(__name__)
_DROPS = Throttle()   # a line per sender and kind per 10 s

MANAGER_ID = NodeId("manager")
#: how a stop reason starts when this node's own I/O loop gave up (exit non-zero)
IO_FAILED = "this node's I/O loop failed"
#: how a stop reason starts when the manager is gone without a word (exit non-zero)
MANAGER_GONE = "lost the manager"
#: the stop reason when the manager told this node to shut down (a requested stop)
SHUTDOWN = "the manager asked this node to shut down"


class Membership:
    """Joins ``node`` to the cluster whose manager listens at ``manager_address``.

    Args:
        node: this process's node (not yet started is fine).
        manager_address: the manager's endpoint.
        role: "worker", "driver", ...
        config: heartbeat and timeout settings.
        on_manager_lost: called (on the I/O thread) when the manager is gone, orders this
            node to shut down, or this node's I/O loop fails.
        address: where the others dial this node, if not its bound address (``--host``).
    """

    def __init__(self, node: Node, manager_address: str, role: str, config: Config,
                 on_manager_lost: Callable[[str], None], slots: int = 1,
                 address: str | None = None) -> None:
        self.node = node
        self.address = address
        self.role = role
        self.config = config
        self.slots = slots
        self._on_manager_lost = on_manager_lost
        self._unanswered_since: float | None = None
        self._stall = StallGuard(config.heartbeat_interval_s, time.monotonic())
        self._changed = threading.Condition()
        self._lookups: set[NodeId] = set()
        self._gone = False
        self._registered = False
        node.add_peer(MANAGER_ID, manager_address, "manager", watch=True)
        node.on(CORE_SERVICE, Kind.NODE_JOINED, self._from_manager(self._joined))
        node.on(CORE_SERVICE, Kind.NODE_DEAD, self._from_manager(self._dead))
        node.on(CORE_SERVICE, Kind.HEARTBEAT_ACK, self._from_manager(self._ack))
        node.on(CORE_SERVICE, Kind.SHUTDOWN, self._from_manager(self._shutdown))
        node.on_unknown_destination(self._lookup)
        node.on_node_lost(lambda _nid: self._notify())
        node.on_fatal(lambda reason: self._lose(f"{IO_FAILED}: {reason}"))

    def join(self, timeout_s: float) -> None:
        """Register and wait for the directory.

        Raises:
            NodeLost: nothing listens at the manager's address (known within about
                ``REFUSED_GRACE_S``).
            AuthError: the manager refused our handshake (the cluster secret differs).
            ActorpyTimeout: no manager answered (e.g. a listener that is not one).
        """
        info = {"role": self.role, "address": self.address or self.node.address,
                "pid": os.getpid(), "host": socket.gethostname(), "slots": self.slots}
        peer = self.node.peer(MANAGER_ID)
        address = peer.address if peer else "?"
        try:
            directory = self.node.call(MANAGER_ID, CORE_SERVICE, Kind.REGISTER, info,
                                       timeout_s=timeout_s, what="registration")
        except ActorpyTimeout:
            if self.node.link_ever_up(MANAGER_ID):
                # the listener proved the cluster key; a manager answers over a link of its
                # own to info["address"]: was "no manager answered ... is it running there?"
                raise ActorpyTimeout(
                    f"{address} took this {self.role}'s connection (it holds the cluster "
                    f"secret) but did not answer its registration within {timeout_s} s: a "
                    f"manager answers by connecting back to {info['address']}, so check that "
                    "the manager's machine can reach that address (a firewall, NAT: "
                    "`actorpy worker --bind ... --host ...`); or is that no manager's "
                    "address (a worker's, an `actorpy peer`'s), or an overloaded one's?") \
                    from None
            raise ActorpyTimeout(f"no manager answered at {address} within {timeout_s} s; "
                                 "is `actorpy manager` running there?") from None
        except NodeLost as exc:
            raise NodeLost(MANAGER_ID, f"{exc}; is `actorpy manager` running there, on that "
                                       "port?") from None
        except AuthError:
            if self.node.link_verdict(MANAGER_ID) is not Verdict.AUTH_FAILED:
                raise
            raise secret_error(AuthError, f"the manager at {address} refused this client's "
                                          "key: is the secret from {how} the cluster's?") from None
        self._registered = True
        for node_id, address, role, slots in directory:
            if node_id != self.node.node_id:
                self.node.add_peer(node_id, address, role, slots)
        self._notify()
        self.node.call_later(0, self._heartbeat)

    def leave(self) -> None:
        """Tell the manager this node is leaving on purpose (best effort, no wait).

        Not when it never registered: to a listener that is not a manager (an HTTP server)
        the goodbye waited, forever, for a connection that never completes its handshake,
        and a worker that could not join hung instead of saying so."""
        if self._registered and not self.node.closed and not self._gone:
            try:
                self.node.send(MANAGER_ID, CORE_SERVICE, Kind.LEAVE)
            except ActorpyError:
                pass

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Block until ``predicate()`` holds (re-checked whenever the directory changes)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ActorpyTimeout(f"timed out after {timeout_s} s waiting for {what}")
                self._changed.wait(min(left, 0.5))

    @staticmethod
    def _from_manager(handler: Callable[[wm.Message], None]) -> Callable[[wm.Message], None]:
        """Membership news counts only when the manager says it."""
        def guarded(msg: wm.Message) -> None:
            if msg.sender != MANAGER_ID:
                _DROPS.log(log, (msg.sender, msg.kind), "dropped a %s from %r: only the manager "
                           "may send it", Kind(msg.kind).name, msg.sender)
                return
            handler(msg)
        return guarded

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _lose(self, reason: str) -> None:
        if not self._gone:
            self._gone = True
            self._on_manager_lost(reason)

    def _lose_manager(self, detail: str) -> None:
        """The manager is gone without a word; whoever owns this node reports it (the
        worker's command line, the driver's Cluster), so it is logged here only at INFO."""
        peer = self.node.peer(MANAGER_ID)
        reason = f"{MANAGER_GONE} at {peer.address if peer else '?'}: {detail}"
        log.info("%s: %s; leaving", self.node.node_id, reason)
        self._lose(reason)

    def _heartbeat(self) -> None:
        if self.node.closed or self._gone:
            return
        now = time.monotonic()
        stalled = self._stall.tick(now)
        if stalled and self._unanswered_since is not None:
            self._unanswered_since += stalled  # our own stall is not the manager's silence
        limit = self.config.manager_timeout_s
        down = self.node.link_down_for(MANAGER_ID) or 0.0
        if down > limit:
            auth = self.node.auth_failure(MANAGER_ID)
            self._lose_manager(f"its connection is down for {down:.1f} s"
                               + (f" ({auth})" if auth else ""))
            return
        if self._unanswered_since is not None and now - self._unanswered_since > limit:
            silent = f"it has not answered for {now - self._unanswered_since:.1f} s"
            self._lose_manager(f"{silent}; its connection is down" if down else
                               f"{silent} over a live connection (restarted since, it does not "
                               "know this node; or it declared this node dead; or it is stuck)")
            return
        try:
            self.node.send(MANAGER_ID, CORE_SERVICE, Kind.HEARTBEAT)
        except ActorpyError:
            if self.node.closed:  # closing meanwhile, from another thread
                return
            raise
        if self._unanswered_since is None:
            self._unanswered_since = now
        self.node.call_later(self.config.heartbeat_interval_s, self._heartbeat)

    def _ack(self, msg: wm.Message) -> None:
        self._unanswered_since = None

    def _joined(self, msg: wm.Message) -> None:
        node_id, address, role, slots = _fields(msg, "NODE_JOINED", 4)
        if node_id != self.node.node_id:
            try:
                self.node.add_peer(NodeId(node_id), address, role, slots)
            except ActorpyError as exc:
                log.warning("could not add node %s: %s", node_id, exc)
            self._lookups.discard(node_id)
        self._notify()

    def _dead(self, msg: wm.Message) -> None:
        node_id, reason, state = _fields(msg, "NODE_DEAD", 3)
        if node_id == self.node.node_id:
            self._shutdown(msg)
            return
        log.info("%s: node %s is %s (%s)", self.node.node_id, node_id, state, reason)
        self.node.mark_dead(NodeId(node_id), reason, left=state == "left")

    def _shutdown(self, msg: wm.Message) -> None:
        self._lose(SHUTDOWN)

    def _lookup(self, node_id: NodeId) -> None:
        if node_id in self._lookups or node_id == MANAGER_ID:
            return
        self._lookups.add(node_id)
        fut = self.node.request(MANAGER_ID, CORE_SERVICE, Kind.LOOKUP, node_id,
                                what=f"lookup of {node_id}",
                                timeout_s=max(5.0, self.config.manager_timeout_s))

        def learned(f: object) -> None:
            self._lookups.discard(node_id)
            try:
                found = fut.result(0)
            except ActorpyTimeout:  # the manager is slow: the next send asks again
                log.warning("lookup of %s got no answer from the manager", node_id)
                return
            except ActorpyError as exc:
                log.debug("lookup of %s failed: %s", node_id, exc)
                found = None
            if found is None:
                self.node.mark_dead(node_id, "unknown to the manager")
            else:
                self.node.add_peer(node_id, *found)
        fut.add_done_callback(learned)


def _fields(msg: wm.Message, what: str, n: int) -> tuple[Any, ...]:
    value = decode_payload(msg, what)
    if not isinstance(value, (tuple, list)) or len(value) != n:
        raise ProtocolError(f"{what} from {msg.sender!r} is not a {n}-tuple")
    return tuple(value)

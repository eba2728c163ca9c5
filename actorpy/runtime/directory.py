"""A node's peer directory: who is where, who is dead, messages parked for nodes not yet
known, one link (a DEALER) per peer, and the membership events (``events.Listeners``).

Sending never blocks inside libzmq. Each DEALER has a send high-water mark, so a peer that
does not keep up stops taking messages; what it does not take waits in the link's
``backlog``, in order. A thread of the caller's then waits (outside any lock) until its
message is handed over — a fast sender slows down instead of growing memory without limit —
while the node's I/O thread never waits: it leaves its messages in the backlog, which its
loop flushes. (A blocking send under the link's lock could deadlock two nodes whose I/O
threads each wait for the other's lock.)

Watched links (the manager's link to each member, a member's link to the manager) also run
libzmq's ZMTP heartbeats and a socket monitor; ``actorpy.runtime.liveness`` reads them.

Lock order: the directory lock, then a link's lock.
"""
from __future__ import annotations

import errno
import logging
import struct
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable

import zmq

from actorpy.errors import ActorpyError, ConfigError, NodeLost
from actorpy.ids import NodeId
from actorpy.runtime.events import Listeners, NodeEvent, NodeEventKind, Peer
from actorpy.runtime.files import no_socket_hint
from actorpy.runtime.liveness import REFUSED_GRACE_S, LinkWatch, LivenessTimes, Verdict
from actorpy.wire import message as wm
from actorpy.wire.auth import Security

log = logging.getLogger(__name__)
# pyzmq's flags as plain ints (its enum operators cost more than a send's own checks)
_SNDMORE, _NOBLOCK = int(zmq.SNDMORE), int(zmq.NOBLOCK)

#: dead node ids remembered (oldest forgotten first; a forgotten one is looked up again)
MAX_DEAD = 10_000
#: messages parked for one node whose address is not known yet, and such nodes at once
MAX_PARKED_PER_NODE = 1_000
MAX_PARKED_NODES = 1_000
#: how often a sender held back by a full peer queue retries by itself
RETRY_S = 0.005
_MONITOR_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
                   | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                   | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_CONNECTED
                   | zmq.EVENT_CONNECT_RETRIED)
_EVENT = struct.Struct("=HI")  # a monitor event's first frame: event id, value


class Link:
    """The DEALER to one peer, its lock, and the messages it has not taken yet."""

    __slots__ = ("node_id", "address", "sock", "lock", "cond", "backlog", "queued", "flushed",
                 "closed", "monitor")

    def __init__(self, node_id: NodeId, address: str, sock: zmq.Socket,
                 monitor: zmq.Socket | None) -> None:
        self.node_id, self.address, self.sock, self.monitor = node_id, address, sock, monitor
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.backlog: deque[list[Any]] = deque()
        self.queued = self.flushed = 0
        self.closed = False


def write(sock: zmq.Socket, frames: list[Any]) -> bool:
    """Hand one message to libzmq without blocking; False if the peer's queue is full.

    The high-water mark counts whole messages, so once the first frame is taken the rest
    of the message is too."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        big = not isinstance(frame, bytes) and memoryview(frame).nbytes >= wm.ZERO_COPY_MIN_BYTES
        flags = _SNDMORE if i < last else 0
        if i == 0:
            try:
                sock.send(frame, flags | _NOBLOCK, copy=not big)
            except zmq.Again:
                return False
        else:
            sock.send(frame, flags, copy=not big)
    return True


class Directory:
    """Peers, links and membership events of one node (thread-safe).

    Args:
        ctx, security, sender: the node's context, security and header sender bytes.
        linger_ms, send_hwm: socket settings of every link.
        times: ZMTP heartbeat settings of watched links.
        adopt, release: hand a monitor socket to the I/O loop (with its callback), or back.
        wants_flush: ask the I/O loop to flush backlogs soon.
        in_io_thread: whether the calling thread is the node's I/O thread.
    """

    def __init__(self, ctx: zmq.Context, security: Security, sender: bytes, *,
                 linger_ms: int, send_hwm: int, times: LivenessTimes,
                 adopt: Callable[[zmq.Socket, Callable[[], None]], None],
                 release: Callable[[zmq.Socket], None], wants_flush: Callable[[], None],
                 in_io_thread: Callable[[], bool]) -> None:
        self._ctx, self._security, self._sender = ctx, security, sender
        self.linger_ms, self._send_hwm, self._times = linger_ms, send_hwm, times
        self._adopt, self._release, self._wants_flush = adopt, release, wants_flush
        self._in_io_thread = in_io_thread
        self._lock = threading.Lock()
        self._peers: dict[NodeId, Peer] = {}
        self._dead: OrderedDict[NodeId, Peer | None] = OrderedDict()
        self._links: dict[NodeId, Link] = {}
        self._parked: dict[NodeId, list[list[Any]]] = {}
        self._watched: dict[NodeId, LinkWatch] = {}
        #: how long a link watched from now on may find nobody listening before that is its
        #: verdict (``liveness.REFUSED_GRACE_S``; longer for a manager known to be starting)
        self.refused_grace_s = REFUSED_GRACE_S
        self._backlogged: set[Link] = set()
        self.events = Listeners()
        self._closed = False
        #: said by every call refused once closed ("is closed: " and why, where known)
        self.closed_why = "is closed"
        self.node_id = sender.decode("ascii")
        #: called with a node id when a message is parked for it (outside the lock)
        self.on_unknown: Callable[[NodeId], None] | None = None
        #: called on the I/O thread when a watched link proves something (see liveness)
        self.on_verdict: Callable[[NodeId, Verdict, str], None] | None = None
        #: called on the I/O thread when a watched link completes a handshake
        self.on_link_up: Callable[[NodeId], None] | None = None

    # ------------------------------------------------------------------ peers
    def add_peer(self, node_id: NodeId, address: str, role: str, slots: int = 1,
                 watch: bool = False) -> None:
        with self._lock:
            is_new = node_id not in self._peers
            self._dead.pop(node_id, None)
            peer = self._peers[node_id] = Peer(node_id, address, role, slots)
            if watch and node_id not in self._watched:
                self._watched[node_id] = LinkWatch(time.monotonic(), self.refused_grace_s)
            parked = self._parked.pop(node_id, [])
            link = self._links.get(node_id)
            if link is None and (parked or watch):
                link = self._new_link(peer)
            if parked and link is not None:
                with link.lock:  # before any newer message: we hold the directory lock
                    for frames in parked:
                        self._deliver_locked(link, frames, wait=False)
        if is_new:
            self.events.publish(NodeEvent(NodeEventKind.JOINED, node_id, role))

    def forget_peer(self, node_id: NodeId) -> None:
        with self._lock:
            self._peers.pop(node_id, None)
            self._watched.pop(node_id, None)
            link = self._links.pop(node_id, None)
        if link is not None:
            self._close_link(link, self.linger_ms)

    def mark_dead(self, node_id: NodeId) -> tuple[bool, str]:
        """Forget ``node_id`` for good; returns (whether it was not dead yet, its role)."""
        with self._lock:
            if node_id in self._dead:
                return False, ""
            peer = self._peers.pop(node_id, None)
            self._dead[node_id] = peer
            if len(self._dead) > MAX_DEAD:
                self._dead.popitem(last=False)
            self._parked.pop(node_id, None)
            self._watched.pop(node_id, None)
            link = self._links.pop(node_id, None)
        if link is not None:
            self._close_link(link, 0)
        return True, peer.role if peer else ""

    def peers(self, role: str | None = None) -> list[Peer]:
        return [p for p in list(self._peers.values()) if role is None or p.role == role]

    def peer(self, node_id: NodeId) -> Peer | None:
        return self._peers.get(node_id) or self._dead.get(node_id)

    def is_dead(self, node_id: NodeId) -> bool:
        return node_id in self._dead

    def link_count(self) -> int:
        return len(self._links)

    def parked_count(self) -> int:
        return sum(len(v) for v in list(self._parked.values()))

    # ------------------------------------------------------------------ sending
    def send(self, dest: NodeId, frames: list[Any]) -> None:
        """Send one message to ``dest`` (see the module docstring for when it waits)."""
        link = self._links.get(dest)
        if link is None:
            link = self._open(dest, frames)
            if link is None:
                return
        with link.lock:
            if not link.backlog and not link.closed:
                try:
                    if write(link.sock, frames):
                        return
                except zmq.ZMQError as exc:
                    self._send_failed(dest, exc)
                    return
            self._deliver_locked(link, frames, wait=not self._in_io_thread())

    def _open(self, dest: NodeId, frames: list[Any]) -> Link | None:
        """The link to ``dest``, created now; None when the message was parked or dropped."""
        with self._lock:
            if self._closed:
                raise NodeLost(self.node_id, f"node {self.node_id} {self.closed_why}")
            if dest in self._dead:
                log.debug("dropping a message for dead node %s", dest)
                return None
            link = self._links.get(dest)
            if link is not None:
                return link
            peer = self._peers.get(dest)
            if peer is not None:
                return self._new_link(peer)
            queue = self._parked.get(dest)
            if queue is None and len(self._parked) >= MAX_PARKED_NODES or \
                    queue is not None and len(queue) >= MAX_PARKED_PER_NODE:
                raise ActorpyError(
                    f"cannot send to node {dest}: its address is unknown and too many messages "
                    "already wait for unknown nodes; is it a member of this cluster?")
            self._parked.setdefault(dest, []).append(frames)
        if self.on_unknown is not None:
            self.on_unknown(dest)
        return None

    def _deliver_locked(self, link: Link, frames: list[Any], wait: bool) -> None:
        """Queue ``frames`` behind the backlog (link lock held); with ``wait``, return only
        once they are handed to libzmq, the link closed, or the node closed."""
        if link.closed:
            self._send_failed(link.node_id, None)
            return
        link.backlog.append(frames)
        link.queued += 1
        mine = link.queued
        try:
            self._flush_locked(link)
        except zmq.ZMQError as exc:
            self._send_failed(link.node_id, exc)
            return
        if link.backlog and link not in self._backlogged:
            self._backlogged.add(link)
            self._wants_flush()
        while wait and link.flushed < mine and not link.closed and self._may_hold(link):
            link.cond.wait(RETRY_S)
            if not link.closed:
                try:
                    self._flush_locked(link)
                except zmq.ZMQError as exc:
                    self._send_failed(link.node_id, exc)
                    return
        if link.closed and link.flushed < mine:
            self._send_failed(link.node_id, None)

    def _may_hold(self, link: Link) -> bool:
        """Whether a sender may wait for ``link`` to take its message: not for a watched
        link whose handshake never succeeded. There is no slow peer to keep pace with, and
        libzmq has no pipe to take it after a failed handshake (a listener that is not a
        node, an HTTP server): a worker's REGISTER waited there for good, past the join's
        timeout. The message stays in the backlog, which the I/O thread flushes."""
        watch = self._watched.get(link.node_id)
        return watch is None or watch.ever_up

    def _flush_locked(self, link: Link) -> None:
        sent = 0
        while link.backlog and write(link.sock, link.backlog[0]):
            link.backlog.popleft()
            sent += 1
        if sent:
            link.flushed += sent
            link.cond.notify_all()
        if not link.backlog:
            self._backlogged.discard(link)

    def flush_backlogs(self) -> bool:
        """Push what waits in backlogs (the I/O loop calls this); True if some still wait."""
        for link in list(self._backlogged):
            with link.lock:
                if link.closed:
                    self._backlogged.discard(link)
                    continue
                try:
                    self._flush_locked(link)
                except zmq.ZMQError as exc:
                    log.debug("cannot flush to %s: %s", link.node_id, exc)
        return bool(self._backlogged)

    def _send_failed(self, dest: NodeId, exc: zmq.ZMQError | None) -> None:
        """A send found its link closed: the node is closing (raise) or the peer died (drop)."""
        if self._closed:
            raise NodeLost(self.node_id, f"node {self.node_id} {self.closed_why}")
        if dest in self._dead or exc is None:
            log.debug("dropping a message for dead node %s", dest)
            return
        if exc.errno == errno.EMFILE:   # this process's limit, not the peer: it lives on
            raise ActorpyError(f"cannot send to {dest}: {exc} (this process has no file "
                               "descriptor left: raise the open-files limit, `ulimit -n`)"
                               ) from None
        raise NodeLost(dest, f"cannot send to {dest}: {exc}") from exc

    # ------------------------------------------------------------------ links
    def _new_link(self, peer: Peer) -> Link:
        """Open the DEALER to ``peer`` (directory lock held)."""
        if self._closed:
            raise NodeLost(self.node_id, f"node {self.node_id} {self.closed_why}")
        watch = peer.node_id in self._watched
        monitor = None
        try:
            sock = self._ctx.socket(zmq.DEALER)
        except zmq.ZMQError as exc:
            raise ActorpyError(f"cannot open a socket to {peer.node_id}: {exc} "
                               f"({no_socket_hint(self._ctx)})") from None
        try:
            sock.setsockopt(zmq.IDENTITY, self._sender)
            sock.sndhwm = self._send_hwm
            sock.linger = self.linger_ms
            self._security.apply_client(sock)
            if watch:
                t = self._times
                sock.setsockopt(zmq.HEARTBEAT_IVL, _ms(t.ping_interval_s))
                sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, _ms(t.ping_timeout_s))
                sock.setsockopt(zmq.HANDSHAKE_IVL, _ms(max(t.ping_timeout_s, 1.0)))
                monitor = sock.get_monitor_socket(_MONITOR_EVENTS)
            sock.connect(peer.address)
        except zmq.ZMQError as exc:
            if monitor is not None:
                sock.disable_monitor()   # before its PAIR closes: see _close_link
                monitor.close(linger=0)
            sock.close(linger=0)
            if exc.errno == errno.EMFILE:
                raise ActorpyError(f"cannot connect to {peer.node_id}: {exc} "
                                   f"({no_socket_hint(self._ctx)})") from None
            raise ConfigError(f"cannot connect to {peer.node_id} at {peer.address!r}: {exc}") \
                from None
        link = self._links[peer.node_id] = Link(peer.node_id, peer.address, sock, monitor)
        if monitor is not None:
            self._adopt(monitor, lambda: self._on_monitor(link))
        return link

    def _close_link(self, link: Link, linger_ms: int) -> None:
        with link.lock:
            link.closed = True
            link.backlog.clear()
            self._backlogged.discard(link)
            link.cond.notify_all()
            if link.monitor is not None:
                # Stop the events first. libzmq's I/O thread sends each monitor event with a
                # blocking send; one sent while the socket lingers (a DISCONNECTED as the
                # peer goes) to a monitor PAIR we already closed blocks that thread for
                # good, and with it every socket of the node (seen: a manager went deaf
                # once a driver left, about 1 run in 10).
                link.sock.disable_monitor()
            link.sock.close(linger=linger_ms)
        if link.monitor is not None:
            self._release(link.monitor)

    def _on_monitor(self, link: Link) -> None:
        """Read a watched link's monitor events (I/O thread)."""
        while link.monitor is not None:
            try:
                frames = link.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:  # Again: all read; or released meanwhile
                return
            watch = self._watched.get(link.node_id)
            if len(frames[0]) != _EVENT.size or watch is None or link.closed:
                continue
            event, value = _EVENT.unpack(frames[0])
            verdict = watch.on_event(event, value, time.monotonic())
            if verdict is not None and self.on_verdict is not None:
                self.on_verdict(link.node_id, verdict, link.address)
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED and self.on_link_up is not None:
                self.on_link_up(link.node_id)

    def link_down_for(self, node_id: NodeId, now: float) -> float | None:
        """How long a watched link has been down (None: not watched)."""
        watch = self._watched.get(node_id)
        return None if watch is None else watch.down_for(now)

    def link_ever_up(self, node_id: NodeId) -> bool:
        watch = self._watched.get(node_id)
        return watch is not None and watch.ever_up

    def verdict(self, node_id: NodeId) -> Verdict | None:
        watch = self._watched.get(node_id)
        return None if watch is None else watch.verdict

    def close(self, linger_ms: int) -> None:
        """Close every link (idempotent); later sends raise NodeLost."""
        with self._lock:
            self._closed = True
            links = list(self._links.values())
            self._links.clear()
            self._parked.clear()
            self._watched.clear()
        for link in links:
            self._close_link(link, linger_ms)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))

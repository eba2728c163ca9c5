"""One process's endpoint: a bound ROUTER for everything addressed to this node, one DEALER
per peer for sending, and an I/O thread that receives, authenticates, validates and
dispatches on ``(service, kind)``.

Sending happens in the caller's thread (each peer's DEALER has a lock), so a message goes out
with no thread hand-off; only the ROUTER is owned by the I/O thread. Handlers registered with
``on()`` run on the I/O thread and must be quick; long work goes to the caller's executors.
Replies to ``request()`` resolve a ``ReplyFuture`` that unpickles in the waiting thread.
"""
from __future__ import annotations

import enum
import heapq
import itertools
import logging
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any, Callable

import zmq

from actorpy.errors import ConfigError, NodeLost, ProtocolError
from actorpy.config import Config
from actorpy.ids import NodeId
from actorpy.log import Throttle
from actorpy.runtime import remote
from actorpy.runtime.reply import ReplyFuture
from actorpy.wire import header as hdr
from actorpy.wire import message as wm
from actorpy.wire.auth import Security
from actorpy.wire.kinds import CORE_SERVICE, Kind

log = logging.getLogger(__name__)

Handler = Callable[[wm.Message], None]


@dataclass(frozen=True)
class Peer:
    node_id: NodeId
    address: str
    role: str
    slots: int = 1  # tasks the node runs at once (workers); 1 for the rest


class NodeEventKind(enum.Enum):
    JOINED = "joined"   # first seen (joined the cluster, or already there when we joined)
    LEFT = "left"       # left on purpose
    DEAD = "dead"       # declared dead (by the manager, or by us)


@dataclass(frozen=True)
class NodeEvent:
    """A change in membership, as this node learned it."""

    kind: NodeEventKind
    node_id: NodeId
    role: str
    reason: str = ""


class Subscription:
    """What ``Node.subscribe`` returns: ``cancel()`` stops the deliveries (idempotent)."""

    def __init__(self, listeners: dict[int, Callable[[NodeEvent], None]], key: int) -> None:
        self._listeners, self._key = listeners, key

    def cancel(self) -> None:
        self._listeners.pop(self._key, None)


class TimerHandle:
    """A timer set with ``Node.call_later``; ``cancel()`` stops it if it has not run yet."""

    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Node:
    """A node on the cluster's wire (manager, worker and driver each have one).

    Args:
        node_id: this node's id (ASCII, at most 16 bytes).
        bind: endpoint to bind, e.g. ``ipc:///dir/w-1`` or ``tcp://127.0.0.1:*``.
        security: how sockets authenticate (actorpy.wire.auth.Security).
        chunk_bytes, max_frame_bytes, linger_ms: see actorpy.config.Config.
    """

    def __init__(self, node_id: NodeId, bind: str, security: Security, *,
                 chunk_bytes: int | None = None, max_frame_bytes: int = 1 << 30,
                 linger_ms: int = 500) -> None:
        self.node_id = node_id
        self._sender = hdr.sender_bytes(node_id)
        self.security = security
        chunk = security.chunk_bytes if chunk_bytes is None else chunk_bytes
        self.chunk_bytes = max(1, min(chunk, max_frame_bytes))  # no frame over the limit
        self.max_frame_bytes = max_frame_bytes
        self.linger_ms = linger_ms
        self._ctx = zmq.Context()
        self._auth = security.start_authenticator(self._ctx)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.linger = 0
        self._router.rcvhwm = 0
        security.apply_server(self._router)
        try:
            self._router.bind(bind)
        except zmq.ZMQError as exc:
            self._router.close(linger=0)
            if self._auth is not None:
                self._auth.stop()
            self._ctx.term()
            raise ConfigError(f"cannot bind {bind}: {exc}") from None
        self.address: str = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        # With CURVE, peers that fail the handshake never reach us; log them (the ZAP
        # callback in wire.auth logs wrong keys, this catches wrong mechanisms too).
        self._monitor = (self._router.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH) if security.mode == "curve" else None)
        self._wake_recv = self._ctx.socket(zmq.PAIR)
        self._wake_recv.bind(f"inproc://wake-{id(self)}")
        self._wake_send = self._ctx.socket(zmq.PAIR)
        self._wake_send.connect(f"inproc://wake-{id(self)}")
        self._wake_lock = threading.Lock()
        self._handlers: dict[tuple[int, int], Handler] = {}
        self._service_sink: Callable[[wm.Message], bool] | None = None
        # The directory: peers, the dead, messages parked for peers not yet known, and one
        # DEALER per peer. One lock guards all four, so a flush of parked messages and a new
        # send cannot overtake each other. Lock order: _dir_lock, then a DEALER's own lock.
        self._dir_lock = threading.Lock()
        self._peers: dict[NodeId, Peer] = {}
        self._dead: set[NodeId] = set()
        self._dealers: dict[NodeId, tuple[zmq.Socket, threading.Lock]] = {}
        self._parked: dict[NodeId, list[list[Any]]] = defaultdict(list)
        self._pending: dict[int, ReplyFuture] = {}
        self._pending_lock = threading.Lock()
        self._request_ids = itertools.count(1)
        self._timers: list[tuple[float, int, TimerHandle]] = []
        self._timer_seq = itertools.count()
        self._timers_lock = threading.Lock()
        self._watch_fds: dict[int, Callable[[], None]] = {}
        self._listeners: dict[int, Callable[[NodeEvent], None]] = {}
        self._listener_ids = itertools.count()
        self._unknown_dest: Callable[[NodeId], None] | None = None
        self._closed = threading.Event()
        # Messages this node sends to itself (services on one node talking to each other:
        # several P2P peers per worker). Dispatched by the I/O thread like received ones.
        self._loopback: deque[wm.Message] = deque()
        self._throttle = Throttle()
        #: bytes received so far (all frames), for tests and monitoring
        self.bytes_in = 0
        self._thread = threading.Thread(target=self._loop, name=f"actorpy-io-{node_id}",
                                        daemon=True)

    @classmethod
    def from_config(cls, node_id: NodeId, bind: str, security: Security,
                    config: Config) -> Node:
        """A node with the wire settings of ``config`` (what every process uses)."""
        return cls(node_id, bind, security, chunk_bytes=config.chunk_bytes,
                   max_frame_bytes=config.max_frame_bytes, linger_ms=config.linger_ms)

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> Node:
        self._thread.start()
        return self

    def close(self, linger_ms: int | None = None) -> None:
        """Stop the loop, fail pending requests and close every socket (idempotent).

        ``linger_ms`` (default: the node's) bounds how long unsent messages may delay it."""
        linger = self.linger_ms if linger_ms is None else linger_ms
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(NodeLost(self.node_id, f"node {self.node_id} closed"))
        with self._dir_lock:
            dealers, self._dealers = list(self._dealers.values()), {}
        for sock, lock in dealers:
            with lock:
                sock.close(linger=linger)
        if self._monitor is not None:
            self._router.disable_monitor()
            self._monitor.close(linger=0)
        for sock in (self._router, self._wake_recv, self._wake_send):
            sock.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # ----------------------------------------------------------------- directory
    def add_peer(self, node_id: NodeId, address: str, role: str, slots: int = 1) -> None:
        """Learn where a node listens; messages parked for it go out now, before any newer one.
        A node not known before is announced to subscribers as JOINED.

        Raises:
            ConfigError: ``address`` is not an endpoint ZeroMQ can connect to.
        """
        with self._dir_lock:
            is_new = node_id not in self._peers or node_id in self._dead
            self._peers[node_id] = Peer(node_id, address, role, slots)
            self._dead.discard(node_id)
            parked = self._parked.pop(node_id, [])
            if parked and node_id not in self._dealers:
                sock, lock = self._new_dealer(node_id, address, held=True)
                try:
                    for frames in parked:
                        self._write(sock, frames)
                finally:
                    lock.release()
        if is_new:
            self._publish(NodeEvent(NodeEventKind.JOINED, node_id, role))

    def forget_peer(self, node_id: NodeId) -> None:
        """Drop a peer that was only passing by (e.g. a status client); what was sent to it
        may still flush for ``linger_ms``. Not a death: no listener hears of it."""
        with self._dir_lock:
            self._peers.pop(node_id, None)
            entry = self._dealers.pop(node_id, None)
        if entry is not None:
            with entry[1]:
                entry[0].close(linger=self.linger_ms)

    def peers(self, role: str | None = None) -> list[Peer]:
        return [p for p in list(self._peers.values())
                if p.node_id not in self._dead and (role is None or p.role == role)]

    def peer(self, node_id: NodeId) -> Peer | None:
        return self._peers.get(node_id)

    def is_dead(self, node_id: NodeId) -> bool:
        return node_id in self._dead

    def mark_dead(self, node_id: NodeId, reason: str = "", left: bool = False) -> None:
        """Forget a node: fail requests waiting on it and tell the subscribers (LEFT when it
        left on purpose, else DEAD)."""
        with self._dir_lock:
            if node_id in self._dead:
                return
            self._dead.add(node_id)
            self._parked.pop(node_id, None)
            entry = self._dealers.pop(node_id, None)
        if entry is not None:
            with entry[1]:
                entry[0].close(linger=0)
        with self._pending_lock:
            lost = [rid for rid, f in self._pending.items() if f.dest == node_id]
            futures = [self._pending.pop(rid) for rid in lost]
        for fut in futures:
            if not fut.done():
                fut.set_exception(NodeLost(node_id, f"node {node_id} was lost while running "
                                                    f"{fut.what}{': ' + reason if reason else ''}"))
        peer = self._peers.get(node_id)
        self._publish(NodeEvent(NodeEventKind.LEFT if left else NodeEventKind.DEAD, node_id,
                                peer.role if peer else "", reason))

    def subscribe(self, listener: Callable[[NodeEvent], None]) -> Subscription:
        """Call ``listener(event)`` for every membership change (JOINED, LEFT, DEAD).

        It runs on the thread that learned the news (usually the I/O thread), so it must be
        quick and never block; a listener that raises is logged and the others still run.
        """
        key = next(self._listener_ids)
        self._listeners[key] = listener
        return Subscription(self._listeners, key)

    def on_node_lost(self, listener: Callable[[NodeId], None]) -> Subscription:
        """Call ``listener(node_id)`` whenever a node dies or leaves (see ``subscribe``)."""
        def lost(event: NodeEvent) -> None:
            if event.kind is not NodeEventKind.JOINED:
                listener(event.node_id)
        return self.subscribe(lost)

    def _publish(self, event: NodeEvent) -> None:
        for listener in list(self._listeners.values()):
            try:
                listener(event)
            except Exception:  # one broken listener must not silence the others
                log.exception("a membership listener failed on %s", event)

    def on_unknown_destination(self, callback: Callable[[NodeId], None]) -> None:
        """Called when a send targets a node whose address is not yet known."""
        self._unknown_dest = callback

    # ----------------------------------------------------------------- sending
    def send(self, dest: NodeId, service: int, kind: int, payload: Any = wm.NO_PAYLOAD, *,
             request_id: int = 0, step: int = 0, from_service: int = 0,
             snapshot: bool = False) -> None:
        """Send one message (thread-safe; serializes in the calling thread).

        numpy/torch buffers in ``payload`` are sent without copying: do not modify them
        until the request they belong to has been answered (or pass ``snapshot=True``:
        they are copied first, see ``wire.message.assemble``). ``from_service`` names the
        sending service on this node (0: the node itself); receivers see it as
        ``msg.from_service``.

        Raises:
            SerializationError: the payload cannot be pickled or cannot fit max_frame_bytes.
        """
        frames = wm.assemble(service, kind, self._sender, payload, request_id=request_id,
                             step=step, chunk_bytes=self.chunk_bytes,
                             max_frame_bytes=self.max_frame_bytes, snapshot=snapshot,
                             from_service=from_service)
        self._send_frames(dest, frames)

    def request(self, dest: NodeId, service: int, kind: int, payload: Any = wm.NO_PAYLOAD, *,
                step: int = 0, what: str | None = None, from_service: int = 0) -> ReplyFuture:
        """Send a request; the returned future resolves with the reply (RESULT or ERROR).
        Its ``request_id`` is the id the request travels under (a driver cancels a task by it)."""
        if dest in self._dead:
            fut = ReplyFuture(dest, what or f"request {kind}")
            fut.set_exception(NodeLost(dest, f"node {dest} is dead"))
            return fut
        rid = next(self._request_ids)
        fut = ReplyFuture(dest, what or f"request kind {int(kind)} (service {service})",
                          self._thread)
        fut.request_id = rid
        with self._pending_lock:
            self._pending[rid] = fut
        try:
            self.send(dest, service, kind, payload, request_id=rid, step=step,
                      from_service=from_service)
        except BaseException:
            with self._pending_lock:
                self._pending.pop(rid, None)
            raise
        return fut

    def call(self, dest: NodeId, service: int, kind: int, payload: Any = wm.NO_PAYLOAD, *,
             timeout_s: float, step: int = 0, what: str | None = None,
             from_service: int = 0) -> Any:
        """``request(...)`` and wait for the reply's value (at most ``timeout_s``)."""
        fut = self.request(dest, service, kind, payload, step=step, what=what,
                           from_service=from_service)
        try:
            return fut.result(timeout_s)
        finally:
            if not fut.done():
                self.forget(fut)

    def forget(self, fut: ReplyFuture) -> None:
        """Stop waiting for a reply (a late one is then dropped)."""
        with self._pending_lock:
            for rid, f in list(self._pending.items()):
                if f is fut:
                    del self._pending[rid]

    def reply(self, msg: wm.Message, value: Any = None, *, from_service: int = 0) -> None:
        """Answer a request with a value (its arrays are copied first, so the replier may
        change them at once: nothing tells it when the reply has left)."""
        self.send(NodeId(msg.sender), CORE_SERVICE, Kind.RESULT, value,
                  request_id=msg.header.request_id, from_service=from_service, snapshot=True)

    def reply_error(self, msg: wm.Message, exc: BaseException, *, from_service: int = 0) -> None:
        """Answer a request with an exception (it surfaces as RemoteError at the caller)."""
        self.send(NodeId(msg.sender), CORE_SERVICE, Kind.ERROR,
                  remote.capture(exc, self.node_id), request_id=msg.header.request_id,
                  from_service=from_service)

    def _send_frames(self, dest: NodeId, frames: list[Any]) -> None:
        if self._closed.is_set():
            raise NodeLost(self.node_id, f"node {self.node_id} is closed")
        if dest == self.node_id:
            self._send_to_self(frames)
            return
        entry = self._dealers.get(dest)
        if entry is None:
            with self._dir_lock:
                if dest in self._dead:
                    log.debug("dropping a message for dead node %s", dest)
                    return
                entry = self._dealers.get(dest)
                if entry is None:
                    peer = self._peers.get(dest)
                    if peer is None:
                        self._parked[dest].append(frames)
                    else:
                        entry = self._new_dealer(dest, peer.address)
            if entry is None:
                if self._unknown_dest is not None:
                    self._unknown_dest(dest)
                return
        sock, lock = entry
        with lock:
            try:
                self._write(sock, frames)
            except zmq.ZMQError as exc:  # closed under us: the peer died or we are closing
                if self._closed.is_set():
                    raise NodeLost(self.node_id, f"node {self.node_id} is closed") from None
                if dest in self._dead:
                    log.debug("dropping a message for dead node %s", dest)
                    return
                raise NodeLost(dest, f"cannot send to {dest}: {exc}") from exc

    def _send_to_self(self, frames: list[Any]) -> None:
        """Loopback: a message to this node is dispatched by the I/O thread, as if received.
        The frames are copied, so the receiver never shares a buffer with the sender (as on
        the wire); the I/O thread decodes nothing, as for received messages."""
        copied = [bytes(memoryview(f).cast("B")) for f in frames]
        msg = wm.Message.parse(copied, self.max_frame_bytes)
        self._loopback.append(msg)
        self._wake()

    @staticmethod
    def _write(sock: zmq.Socket, frames: list[Any]) -> None:
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            big = not isinstance(frame, bytes) and memoryview(frame).nbytes >= wm.ZERO_COPY_MIN_BYTES
            sock.send(frame, zmq.SNDMORE if i < last else 0, copy=not big)

    def _new_dealer(self, dest: NodeId, address: str,
                    held: bool = False) -> tuple[zmq.Socket, threading.Lock]:
        """Create and register the DEALER to ``dest`` (caller holds ``_dir_lock``); with
        ``held`` its send lock is returned already acquired."""
        if self._closed.is_set():
            raise NodeLost(self.node_id, f"node {self.node_id} is closed")
        sock = self._ctx.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.IDENTITY, self._sender)
            sock.sndhwm = 0
            sock.linger = self.linger_ms
            self.security.apply_client(sock)
            sock.connect(address)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise ConfigError(f"cannot connect to {dest} at {address!r}: {exc}") from None
        lock = threading.Lock()
        if held:
            lock.acquire()
        self._dealers[dest] = (sock, lock)
        return sock, lock

    # ----------------------------------------------------------------- receiving
    def on(self, service: int, kind: int, handler: Handler) -> None:
        """Run ``handler(message)`` on the I/O thread for each message of ``(service, kind)``."""
        self._handlers[(service, int(kind))] = handler

    def set_service_sink(self, sink: Callable[[wm.Message], bool]) -> None:
        """Messages for services other than the core go to ``sink``; it returns False for an
        unknown service (the message is then dropped with a warning)."""
        self._service_sink = sink

    def watch_fd(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the I/O thread when ``fd`` becomes readable (or closes)."""
        self._watch_fds[fd] = callback
        self._wake()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` on the I/O thread after ``delay_s`` seconds (``cancel()`` the
        returned handle to stop it)."""
        handle = TimerHandle(callback)
        with self._timers_lock:
            heapq.heappush(self._timers, (time.monotonic() + delay_s, next(self._timer_seq),
                                          handle))
        if threading.current_thread() is not self._thread:
            self._wake()
        return handle

    def _wake(self) -> None:
        with self._wake_lock:
            try:
                self._wake_send.send(b"", zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_recv, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor, zmq.POLLIN)
        watched: set[int] = set()
        while not self._closed.is_set():
            for fd in set(self._watch_fds) - watched:
                poller.register(fd, zmq.POLLIN)
                watched.add(fd)
            timeout_ms = self._run_timers()
            try:
                events = dict(poller.poll(timeout_ms))
            except zmq.ZMQError as exc:
                if self._closed.is_set():
                    break
                log.error("poll failed on %s: %s", self.node_id, exc)
                continue
            if self._wake_recv in events:
                while self._wake_recv.poll(0):
                    self._wake_recv.recv()
            while self._loopback:
                self._dispatch(self._loopback.popleft())
            if self._router in events:
                self._drain_router()
            if self._monitor is not None and self._monitor in events:
                self._log_handshake_failures()
            for fd in watched & set(events):
                callback = self._watch_fds.pop(fd, None)
                poller.unregister(fd)
                watched.discard(fd)
                if callback is not None:
                    self._guard(callback)

    def _run_timers(self) -> int | None:
        while True:
            with self._timers_lock:
                if not self._timers:
                    return None
                due, _, handle = self._timers[0]
                now = time.monotonic()
                if due > now and not handle.cancelled:
                    return max(1, int((due - now) * 1000))
                heapq.heappop(self._timers)
            if not handle.cancelled:
                self._guard(handle.callback)

    def _guard(self, callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:  # a broken handler must not stop the node
            log.exception("callback failed on node %s", self.node_id)

    def _log_handshake_failures(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        while self._monitor is not None and self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            name = zmq.Event(event["event"]).name
            allowed, held = self._throttle.allow(name)
            if allowed:
                log.warning("rejected a connection to %s: handshake failed (%s, code %s); the peer "
                            "is not a member of this cluster or speaks another protocol%s",
                            self.address, name, event["value"],
                            f" ({held} more since the last report)" if held else "")

    def _drain_router(self) -> None:
        for _ in range(1000):  # bounded, so timers still run under a flood
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._receive(frames)

    def _receive(self, frames: list[zmq.Frame]) -> None:
        routing_id = frames[0].bytes
        self.bytes_in += sum(len(f) for f in frames)
        who = routing_id.decode("ascii", "replace")
        if not self.security.is_trusted(frames[0]):
            log.warning("dropped a message from %r: sender is not an authenticated member", who)
            return
        try:
            msg = wm.Message.parse(frames[1:], self.max_frame_bytes)
        except ProtocolError as exc:
            log.warning("dropped a message from %r: %s", who, exc)
            return
        if msg.sender != who:
            log.warning("dropped a message from %r: it claims to come from %r", who, msg.sender)
            return
        self._dispatch(msg)

    def _dispatch(self, msg: wm.Message) -> None:
        """Route a valid, authenticated message: replies, handlers, then services."""
        who = msg.sender
        service, kind = msg.header.service, msg.header.kind
        if service == CORE_SERVICE and kind in (Kind.RESULT, Kind.ERROR):
            with self._pending_lock:
                fut = self._pending.get(msg.header.request_id)
                if fut is not None and fut.dest == msg.sender:
                    del self._pending[msg.header.request_id]
            if fut is None:
                log.debug("late or unknown reply %d from %s", msg.header.request_id, who)
            elif fut.dest != msg.sender:
                log.warning("dropped a reply from %r: request %d was sent to %r", who,
                            msg.header.request_id, fut.dest)
            elif not fut.done():
                fut.set_result(msg)
            return
        handler = self._handlers.get((service, kind))
        if handler is not None:
            self._guard(lambda: handler(msg))
        elif service != CORE_SERVICE and self._service_sink is not None:
            if not self._service_sink(msg):
                log.warning("dropped a message from %r: no service %d on this node", who, service)
        else:
            log.warning("dropped a message from %r: no handler for kind %d of service %d",
                        who, kind, service)


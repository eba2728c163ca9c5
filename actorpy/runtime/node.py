"""One process's endpoint: a bound ROUTER for everything addressed to this node, one DEALER
per peer for sending, and an I/O thread that receives, authenticates, validates and
dispatches on ``(service, kind)``.

``Node`` is a facade over four parts, each in its own module:

* ``directory.Directory`` — peers, the dead, parked messages, one link (DEALER) per peer,
  membership events; sending with high-water marks that never block the I/O thread;
* ``requests.RequestTable`` — requests waiting for replies, with deadlines;
* ``timers.TimerQueue`` — ``call_later`` timers, run on the I/O thread;
* ``loop.SocketLoop`` — the I/O thread itself (polls, never dies silently).

Sending happens in the caller's thread, so a message goes out with no thread hand-off; only
the ROUTER is owned by the I/O thread. Handlers registered with ``on()`` run on the I/O
thread and must be quick; long work goes to the caller's executors. Replies to ``request()``
resolve a ``ReplyFuture`` that unpickles in the waiting thread.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Any, Callable

import zmq

from actorpy.config import Config
from actorpy.errors import AuthError, ConfigError, NodeLost
from actorpy.ids import NodeId
from actorpy.runtime import remote
from actorpy.runtime.address import refuse_served_ipc
from actorpy.runtime.direct import DirectReplies
from actorpy.runtime.directory import RETRY_S, Directory, write
from actorpy.runtime.events import NodeEvent, NodeEventKind, Peer, Subscription
from actorpy.runtime.liveness import LivenessTimes, Verdict
from actorpy.runtime.loop import SocketLoop
from actorpy.runtime.receive import Handler, Receiver, decode_payload
from actorpy.runtime.reply import ReplyFuture
from actorpy.runtime.requests import RequestTable
from actorpy.runtime.timers import TimerHandle, TimerQueue
from actorpy.wire import header as hdr
from actorpy.wire import message as wm
from actorpy.wire.auth import Security
from actorpy.wire.kinds import CORE_SERVICE, REPLY_KINDS, Kind

__all__ = ["Node", "Peer", "NodeEvent", "NodeEventKind", "Subscription", "TimerHandle",
           "decode_payload"]

log = logging.getLogger(__name__)

#: messages per queue before a sender waits (ZeroMQ high-water marks; counted in messages)
SEND_HWM = 1000
RECV_HWM = 1000
#: request deadlines are checked on this grid, so a stream of requests does not wake the
#: loop once per request (a deadline fires at most this late)
DEADLINE_GRID_S = 0.05


class Node:
    """A node on the cluster's wire (manager, worker and driver each have one).

    Args:
        node_id: this node's id (ASCII, at most 16 bytes).
        bind: endpoint to bind, e.g. ``ipc:///dir/w-1`` or ``tcp://127.0.0.1:*``.
        security: how sockets authenticate (actorpy.wire.auth.Security).
        chunk_bytes, max_frame_bytes, linger_ms: see actorpy.config.Config.
        liveness: ZMTP heartbeat timings of watched links (default: Config's defaults).
        send_hwm, recv_hwm: ZeroMQ high-water marks of each link and of the ROUTER.
        handover: a new connection from a node takes over from its older one (nodes with
            no manager: a peer that first dialled us under a placeholder id, to learn ours,
            then dials again; without it the second connection would be refused).
    """

    def __init__(self, node_id: NodeId, bind: str, security: Security, *,
                 chunk_bytes: int | None = None, max_frame_bytes: int = 1 << 30,
                 linger_ms: int = 500, liveness: LivenessTimes | None = None,
                 send_hwm: int = SEND_HWM, recv_hwm: int = RECV_HWM,
                 handover: bool = False) -> None:
        refuse_served_ipc(bind)
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
        self._router.rcvhwm = recv_hwm
        # It sends only direct replies (actorpy.runtime.direct): one it cannot route (the
        # thread's connection is gone or full) raises, and goes over the link instead.
        self._router.router_mandatory = 1
        if handover:
            self._router.router_handover = 1
        # Checked by libzmq before any byte is kept, also during the CURVE handshake: an
        # outsider cannot make us buffer a frame bigger than a member could send.
        self._router.maxmsgsize = max_frame_bytes + hdr.HEADER_BYTES + wm.INLINE_MAX_BYTES
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
        self._closed = threading.Event()
        self._fatal_listeners: list[Callable[[str], None]] = []
        self._auth_failures: dict[NodeId, str] = {}
        self._timers = TimerQueue()
        self._requests = RequestTable()
        self._flush_wanted = False
        # Messages this node sends to itself (services on one node talking to each other:
        # several P2P peers per worker), dispatched by the I/O thread like received ones.
        self._loopback: deque[wm.Message] = deque()
        self._planned_tick: float | None = None
        self._receiver = Receiver(node_id, security, max_frame_bytes, self._requests,
                                  self.reply_error)
        self._loop = SocketLoop(self._ctx, self._router, f"actorpy-io-{node_id}",
                                lambda: self._receiver.drain(self._router), self._tick,
                                self._fatal)
        self._loop.on_teardown = self._teardown
        self._loop.before_teardown = self._stop_monitors
        self._dir = Directory(self._ctx, security, self._sender, linger_ms=linger_ms,
                              send_hwm=send_hwm, times=liveness or _default_liveness(),
                              adopt=self._loop.adopt, release=self._loop.release,
                              wants_flush=self._wants_flush, in_io_thread=self._loop.in_loop)
        self._dir.on_verdict = self._verdict
        self._direct = DirectReplies(self._ctx, security, node_id, max_frame_bytes,
                                     self._address_of, self._dir.is_dead, self._receiver.resolve)
        # With CURVE, peers that fail the handshake never reach us; log them (the ZAP
        # callback in wire.auth logs wrong keys, this catches wrong mechanisms too).
        self._monitor: zmq.Socket | None = None
        if security.mode == "curve":
            self._monitor = self._router.get_monitor_socket(
                zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
            monitor = self._monitor
            self._loop.adopt(monitor, lambda: self._receiver.log_handshake_failures(
                monitor, self.address))

    @classmethod
    def from_config(cls, node_id: NodeId, bind: str, security: Security,
                    config: Config, *, handover: bool = False) -> Node:
        """A node with the wire and liveness settings of ``config`` (what every process uses)."""
        return cls(node_id, bind, security, chunk_bytes=config.chunk_bytes,
                   max_frame_bytes=config.max_frame_bytes, linger_ms=config.linger_ms,
                   liveness=LivenessTimes.of(config.heartbeat_interval_s, config.dead_after_s,
                                             config.silent_dead_after_s), handover=handover)

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> Node:
        self._loop.start()
        return self

    def close(self, linger_ms: int | None = None) -> None:
        """Stop the loop, fail pending requests and close every socket (idempotent).

        ``linger_ms`` (default: the node's) bounds how long unsent messages may delay it.
        Called from a handler (the I/O thread), the sockets close when the handler returns."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._requests.fail_all(lambda f: NodeLost(self.node_id, f"node {self.node_id} closed"))
        self._dir.close(self.linger_ms if linger_ms is None else linger_ms)
        if not self._loop.running:
            if self._loop.thread.ident is None:  # never started
                self._loop.close_unstarted()
            return
        self._loop.stop()
        if not self._loop.in_loop():
            self._loop.thread.join(timeout=10)
            if self._loop.running:
                log.warning("node %s: the I/O thread is still busy in a handler; its sockets "
                            "close when it returns", self.node_id)

    def _stop_monitors(self) -> None:
        """Stop every socket monitor before the loop closes their PAIR sockets (runs on the
        loop's thread as it exits): libzmq sends monitor events with a blocking send, so an
        event for a closed PAIR would block its I/O thread, and ``ctx.term`` with it."""
        self._closed.set()
        self._dir.close(0)   # links: monitors stopped, then sockets closed
        if self._monitor is not None:
            self._router.disable_monitor()
            self._monitor = None

    def _teardown(self) -> None:
        """Close what the loop's thread owned (runs on it as it exits)."""
        self._stop_monitors()
        self._direct.close()
        self._router.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()

    @property
    def bytes_in(self) -> int:
        """Bytes received so far (all frames), for tests and monitoring."""
        return self._receiver.bytes_in

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def in_io_thread(self) -> bool:
        """Whether the caller runs on this node's I/O thread (where waiting would deadlock)."""
        return self._loop.in_loop()

    def on_fatal(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` if the I/O loop has to give up (the node is then closed;
        a server process should exit non-zero so its supervisor restarts it)."""
        self._fatal_listeners.append(listener)

    def _fatal(self, reason: str) -> None:
        self._closed.set()
        self._requests.fail_all(lambda f: NodeLost(self.node_id, f"node {self.node_id}: {reason}"))
        for listener in list(self._fatal_listeners):
            self._guard(lambda: listener(reason))

    # ----------------------------------------------------------------- directory
    def add_peer(self, node_id: NodeId, address: str, role: str, slots: int = 1, *,
                 watch: bool = False) -> None:
        """Learn where a node listens; messages parked for it go out now, before any newer one.
        A node not known before is announced to subscribers as JOINED. With ``watch`` the
        link to it is opened now, with ZMTP heartbeats and a monitor (``link_down_for``).

        Raises:
            ConfigError: ``address`` is not an endpoint ZeroMQ can connect to.
        """
        self._dir.add_peer(node_id, address, role, slots, watch)

    def forget_peer(self, node_id: NodeId) -> None:
        """Drop a peer that was only passing by (e.g. a status client); what was sent to it
        may still flush for ``linger_ms``. Not a death: no listener hears of it."""
        self._dir.forget_peer(node_id)
        self._auth_failures.pop(node_id, None)

    def peers(self, role: str | None = None) -> list[Peer]:
        """Live peers (of ``role``)."""
        return self._dir.peers(role)

    def peer(self, node_id: NodeId) -> Peer | None:
        """What is known of ``node_id`` (also of a recently dead one)."""
        return self._dir.peer(node_id)

    def is_dead(self, node_id: NodeId) -> bool:
        return self._dir.is_dead(node_id)

    def link_down_for(self, node_id: NodeId) -> float | None:
        """Seconds the watched link to ``node_id`` has been down (0: up; None: not watched)."""
        return self._dir.link_down_for(node_id, time.monotonic())

    def link_ever_up(self, node_id: NodeId) -> bool:
        """Whether the watched link to ``node_id`` has completed a handshake yet."""
        return self._dir.link_ever_up(node_id)

    def link_verdict(self, node_id: NodeId) -> Verdict | None:
        """What the watched link to ``node_id`` has proven, if anything (see liveness)."""
        return self._dir.verdict(node_id)

    def on_link_up(self, callback: Callable[[NodeId], None]) -> None:
        """Call ``callback(node_id)`` on the I/O thread whenever a watched link completes
        a handshake (the first time, and again after each reconnection)."""
        self._dir.on_link_up = callback

    def auth_failure(self, node_id: NodeId) -> str | None:
        """Why ``node_id`` refused our handshake (None: it did not, or it was forgotten)."""
        return self._auth_failures.get(node_id)

    def mark_dead(self, node_id: NodeId, reason: str = "", left: bool = False) -> None:
        """Forget a node: fail requests waiting on it and tell the subscribers (LEFT when it
        left on purpose, else DEAD)."""
        fresh, role = self._dir.mark_dead(node_id)
        self._auth_failures.pop(node_id, None)
        suffix = f": {reason}" if reason else ""
        self._requests.fail_dest(node_id, lambda f: NodeLost(
            node_id, f"node {node_id} was lost while running {f.what}{suffix}"))
        if fresh:
            self._dir.events.publish(NodeEvent(NodeEventKind.LEFT if left else NodeEventKind.DEAD,
                                        node_id, role, reason))

    def subscribe(self, listener: Callable[[NodeEvent], None]) -> Subscription:
        """Call ``listener(event)`` for every membership change (JOINED, LEFT, DEAD).

        It runs on the thread that learned the news (usually the I/O thread), so it must be
        quick and never block; a listener that raises is logged and the others still run.
        """
        return self._dir.events.subscribe(listener)

    def on_node_lost(self, listener: Callable[[NodeId], None]) -> Subscription:
        """Call ``listener(node_id)`` whenever a node dies or leaves (see ``subscribe``)."""
        def lost(event: NodeEvent) -> None:
            if event.kind is not NodeEventKind.JOINED:
                listener(event.node_id)
        return self.subscribe(lost)

    def on_unknown_destination(self, callback: Callable[[NodeId], None]) -> None:
        """Called when a send targets a node whose address is not yet known."""
        self._dir.on_unknown = callback

    def _verdict(self, node_id: NodeId, verdict: Verdict, address: str) -> None:
        if verdict is Verdict.NOT_LISTENING:
            # Not recorded: the link's own watch forgets it once a handshake succeeds.
            log.info("%s", _not_listening(node_id, address))
            self._requests.fail_dest(node_id, lambda f: NodeLost(
                node_id, _not_listening(node_id, address)))
            return
        if verdict is Verdict.AUTH_FAILED:
            text = (f"authentication with {node_id} at {address} failed: it refused our CURVE "
                    "handshake, so the cluster secret differs; use the same secret on every "
                    "node")
        else:
            text = (f"authentication with {node_id} at {address} failed: it speaks another "
                    "security mechanism (CURVE on one side only?); check the address and "
                    "the secret")
        log.info("%s", text)  # whoever waits on it gets an AuthError saying the same
        self._auth_failures[node_id] = text
        self._requests.fail_dest(node_id, lambda f: AuthError(text))

    # ----------------------------------------------------------------- sending
    def send(self, dest: NodeId, service: int, kind: int, payload: Any = wm.NO_PAYLOAD, *,
             request_id: int = 0, step: int = 0, from_service: int = 0,
             snapshot: bool = False, route: bytes | None = None) -> None:
        """Send one message (thread-safe; serializes in the calling thread).

        When ``dest`` does not keep up, this waits until its queue has room (the I/O thread
        never waits). numpy/torch buffers in ``payload`` are sent without copying: do not
        modify them until the request they belong to has been answered (or pass
        ``snapshot=True``: they are copied first, see ``wire.message.assemble``).
        ``from_service`` names the sending service on this node (0: the node itself);
        receivers see it as ``msg.from_service``. ``route`` (a reply's: the request's
        ``msg.route``) sends it back to the thread that asked for a direct reply.

        Raises:
            SerializationError: the payload cannot be pickled or cannot fit max_frame_bytes.
        """
        if self._closed.is_set():
            raise NodeLost(self.node_id, f"node {self.node_id} is closed")
        frames = wm.assemble(service, kind, self._sender, payload, request_id=request_id,
                             step=step, chunk_bytes=self.chunk_bytes,
                             max_frame_bytes=self.max_frame_bytes, snapshot=snapshot,
                             from_service=from_service)
        if dest == self.node_id:
            self._send_to_self(frames)
        elif route is not None:
            self._send_routed(dest, route, frames)
        else:
            self._dir.send(dest, frames)

    def _send_routed(self, dest: NodeId, route: bytes, frames: list[Any]) -> None:
        """A direct reply: out of the ROUTER to the asking thread's socket. Only the I/O
        thread may use the ROUTER: a reply made on another thread goes over the link (its
        receiver's I/O thread wakes the waiter: handing it to our I/O thread instead would
        cost the same wake-up, in this process), as does one the ROUTER cannot route."""
        if not self._loop.in_loop():
            self._dir.send(dest, frames)
            return
        try:
            if write(self._router, [route, *frames]):
                return
        except zmq.ZMQError as exc:   # EHOSTUNREACH: that thread's connection is gone
            log.debug("direct reply to %s not routable (%s); sent over the link", dest, exc)
        self._dir.send(dest, frames)

    def _address_of(self, node_id: NodeId) -> str | None:
        peer = self._dir.peer(node_id)
        return None if peer is None or self._dir.is_dead(node_id) else peer.address

    def _send_to_self(self, frames: list[Any]) -> None:
        """Loopback: a message to this node is dispatched as if received. The frames are
        copied, so the receiver never shares a buffer with the sender (as on the wire), and
        nothing is decoded here. A reply, or a message for a service, is dispatched at once
        on the sending thread (resolving a future and offering to an inbox are thread-safe;
        a service's quick kind may run right here): no hand-off to the I/O thread and back.
        Messages for the node's own handlers go through the I/O thread, where those run."""
        copied = [bytes(memoryview(f).cast("B")) for f in frames]
        msg = wm.Message.parse(copied, self.max_frame_bytes)
        if msg.header.service != CORE_SERVICE or msg.header.kind in REPLY_KINDS:
            self._guard(lambda: self._receiver.dispatch(msg))
            return
        self._loopback.append(msg)
        if not self._loop.in_loop():
            self._loop.wake()

    def request(self, dest: NodeId, service: int, kind: int, payload: Any = wm.NO_PAYLOAD, *,
                step: int = 0, what: str | None = None, timeout_s: float | None = None,
                from_service: int = 0, direct: bool = False) -> ReplyFuture:
        """Send a request; the returned future resolves with the reply (RESULT or ERROR).

        With ``timeout_s`` the request is failed with ActorpyTimeout (and forgotten) at its
        deadline, whether or not anyone waits on it. It fails with NodeLost when ``dest``
        dies, AuthError when ``dest`` refuses our handshake. Its ``request_id`` is the id
        the request travels under (a driver cancels a task by it).

        With ``direct`` the reply comes back to the calling thread's own socket
        (actorpy.runtime.direct), no other thread in between: wait for it on this thread,
        with ``wait`` or the future's ``result``/``exception`` (another thread waiting on it
        would not read that socket). A direct request is not ordered with this node's other
        messages to ``dest``.
        """
        if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s >= 0):
            raise ConfigError(f"timeout_s must be a finite number >= 0, got {timeout_s}")
        fut = ReplyFuture(dest, what or f"request kind {int(kind)} (service {service})",
                          self._loop.thread, timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        rid = self._requests.add(fut, deadline)
        fut.request_id = rid
        # After add: a concurrent mark_dead either saw this entry or is seen here.
        if self._dir.is_dead(dest):
            self._requests.fail(fut, NodeLost(dest, f"node {dest} is dead"))
            return fut
        if dest in self._auth_failures:
            self._requests.fail(fut, AuthError(self._auth_failures[dest]))
            return fut
        if self.link_verdict(dest) is Verdict.NOT_LISTENING:
            peer = self._dir.peer(dest)
            self._requests.fail(fut, NodeLost(dest, _not_listening(
                dest, peer.address if peer else "?")))
            return fut
        if deadline is not None:
            self._deadline_added(deadline)
        try:
            if direct and dest != self.node_id and not self._loop.in_loop():
                fut.waiter = self.wait
                self._send_direct(dest, service, kind, payload, rid, step, from_service)
            else:
                self.send(dest, service, kind, payload, request_id=rid, step=step,
                          from_service=from_service)
        except BaseException:
            self._requests.discard(fut)
            raise
        return fut

    def _send_direct(self, dest: NodeId, service: int, kind: int, payload: Any, rid: int,
                     step: int, from_service: int) -> None:
        if self._closed.is_set():
            raise NodeLost(self.node_id, f"node {self.node_id} is closed")
        frames = wm.assemble(service, kind, self._sender, payload, request_id=rid, step=step,
                             chunk_bytes=self.chunk_bytes, max_frame_bytes=self.max_frame_bytes,
                             from_service=from_service)
        if not self._direct.send(dest, frames):
            self._dir.send(dest, frames)

    def wait(self, futures: Any, timeout_s: float | None) -> set[ReplyFuture]:
        """Wait until one of ``futures`` (this node's) is done, at most ``timeout_s``;
        returns the done ones (empty when the time ran out). Direct replies to this
        thread are read from its own socket while it waits."""
        return self._direct.wait(futures, timeout_s)

    def call(self, dest: NodeId, service: int, kind: int, payload: Any = wm.NO_PAYLOAD, *,
             timeout_s: float, step: int = 0, what: str | None = None,
             from_service: int = 0) -> Any:
        """``request(...)`` and wait for the reply's value (at most ``timeout_s``)."""
        fut = self.request(dest, service, kind, payload, step=step, what=what,
                           timeout_s=timeout_s, from_service=from_service)
        try:
            return fut.result(timeout_s)
        finally:
            if not fut.done():
                self.forget(fut)

    def forget(self, fut: ReplyFuture) -> None:
        """Stop waiting for a reply (a late one is then dropped)."""
        self._requests.discard(fut)

    def reply(self, msg: wm.Message, value: Any = None, *, from_service: int = 0) -> None:
        """Answer a request with a value (its arrays are copied first, so the replier may
        change them at once: nothing tells it when the reply has left)."""
        self.send(NodeId(msg.sender), CORE_SERVICE, Kind.RESULT, value,
                  request_id=msg.header.request_id, from_service=from_service, snapshot=True,
                  route=msg.route)

    def reply_error(self, msg: wm.Message, exc: BaseException, *, from_service: int = 0) -> None:
        """Answer a request with an exception (it surfaces as RemoteError at the caller)."""
        self.send(NodeId(msg.sender), CORE_SERVICE, Kind.ERROR,
                  remote.capture(exc, self.node_id), request_id=msg.header.request_id,
                  from_service=from_service, route=msg.route)

    # ----------------------------------------------------------------- the loop
    def on(self, service: int, kind: int, handler: Handler) -> None:
        """Run ``handler(message)`` on the I/O thread for each message of ``(service, kind)``."""
        self._receiver.handlers[(service, int(kind))] = handler

    def set_service_sink(self, sink: Callable[[wm.Message], bool]) -> None:
        """Messages for services other than the core go to ``sink``; it returns False for an
        unknown service (a request then gets an ERROR reply naming it)."""
        self._receiver.service_sink = sink

    def watch_fd(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the I/O thread when ``fd`` becomes readable (or closes)."""
        self._loop.watch_fd(fd, callback)

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` on the I/O thread after ``delay_s`` seconds (``cancel()`` the
        returned handle to stop it)."""
        handle = self._timers.add(delay_s, callback)
        if not self._loop.in_loop():
            self._loop.wake()
        return handle

    def _deadline_added(self, deadline: float) -> None:
        planned = self._planned_tick
        if planned is None or _on_grid(deadline) < planned:
            if not self._loop.in_loop():
                self._loop.wake()

    def _wants_flush(self) -> None:
        self._flush_wanted = True
        if not self._loop.in_loop():
            self._loop.wake()

    def _tick(self, now: float) -> float | None:
        """Run due timers, expire requests, flush backlogs; returns when to run next."""
        self._planned_tick = math.inf  # until decided below, every new deadline wakes us
        while self._loopback:
            self._guard(lambda msg=self._loopback.popleft(): self._receiver.dispatch(msg))
        while (handle := self._timers.pop_due(now)) is not None:
            self._guard(handle.callback)
        nexts = [self._timers.next_due()]
        deadline = self._requests.expire(now)
        nexts.append(None if deadline is None else _on_grid(deadline))
        if self._flush_wanted:
            self._flush_wanted = self._dir.flush_backlogs()
            if self._flush_wanted:
                nexts.append(now + RETRY_S)
        due = min((t for t in nexts if t is not None), default=None)
        self._planned_tick = due
        return due

    def _guard(self, callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:  # a broken handler must not stop the node
            log.exception("callback failed on node %s", self.node_id)


def _on_grid(t: float) -> float:
    return math.ceil(t / DEADLINE_GRID_S) * DEADLINE_GRID_S


def _default_liveness() -> LivenessTimes:
    defaults = Config()
    return LivenessTimes.of(defaults.heartbeat_interval_s, defaults.dead_after_s,
                            defaults.silent_dead_after_s)


def _not_listening(node_id: NodeId, address: str) -> str:
    return (f"nothing is listening at {address} (connections to {node_id} are refused, or "
            "its host is unreachable)")

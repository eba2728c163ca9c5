"""One process's endpoint: a bound ROUTER for everything addressed to this node, one DEALER
per peer for sending, and an I/O thread that receives, authenticates, validates and
dispatches on ``(service, kind)``.

``Node`` is a facade over four parts, each in its own module:

* ``directory.Directory`` — peers, the dead, parked messages, one link (DEALER) per peer,
  membership events; sending with high-water marks that never block the I/O thread;
* ``requests.RequestTable`` — requests waiting for replies, with deadlines;
* ``timers.TimerQueue`` — ``call_later`` timers, run on the I/O thread;
* ``loop.SocketLoop`` — the I/O thread itself (polls, never dies silently).

Its calls are in three files: this one has its sockets, lifecycle and loop (handlers,
timers, the tick); ``node_peers.NodePeers`` the directory calls (peers, links, the dead,
membership events); ``node_messages.NodeMessaging`` send, request, call and reply.

Sending happens in the caller's thread, so a message goes out with no thread hand-off; only
the ROUTER is owned by the I/O thread. Handlers registered with ``on()`` run on the I/O
thread and must be quick; long work goes to the caller's executors. Replies to ``request()``
resolve a ``ReplyFuture`` that unpickles in the waiting thread.
"""
from __future__ import annotations

import logging
import math
import threading
from collections import deque
from typing import Callable

import zmq

from actorpy.config import Config
from actorpy.errors import ConfigError, NodeLost
from actorpy.ids import NodeId
from actorpy.runtime.address import bind_refused, refuse_served_ipc
from actorpy.runtime.direct import DirectReplies
from actorpy.runtime.directory import RETRY_S, Directory
from actorpy.runtime.events import NodeEvent, NodeEventKind, Peer, Subscription
from actorpy.runtime.files import size_context
from actorpy.runtime.liveness import LivenessTimes
from actorpy.runtime.loop import SocketLoop
from actorpy.runtime.node_messages import NodeMessaging, on_grid
from actorpy.runtime.node_peers import NodePeers
from actorpy.runtime.receive import Handler, Receiver, decode_payload
from actorpy.runtime.requests import RequestTable
from actorpy.runtime.timers import TimerHandle, TimerQueue
from actorpy.wire import header as hdr
from actorpy.wire import message as wm
from actorpy.wire.auth import Security

__all__ = ["Node", "Peer", "NodeEvent", "NodeEventKind", "Subscription", "TimerHandle",
           "decode_payload"]

log = logging.getLogger(__name__)

#: messages per queue before a sender waits (ZeroMQ high-water marks; counted in messages)
SEND_HWM = 1000
RECV_HWM = 1000
#: how long a connection may take to prove the secret before the node drops it
HANDSHAKE_S = 10.0


class Node(NodePeers, NodeMessaging):
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
                 chunk_bytes: int | None = None, max_frame_bytes: int | None = None,
                 linger_ms: int = 500, liveness: LivenessTimes | None = None,
                 send_hwm: int = SEND_HWM, recv_hwm: int = RECV_HWM,
                 handover: bool = False) -> None:
        refuse_served_ipc(bind)
        self.node_id = node_id
        self._sender = hdr.sender_bytes(node_id)
        self.security = security
        chunk = security.chunk_bytes if chunk_bytes is None else chunk_bytes
        if max_frame_bytes is None:     # the senders' chunks: 8 MiB under CURVE (Config)
            max_frame_bytes = max(chunk, security.chunk_bytes)
        self.chunk_bytes = max(1, min(chunk, max_frame_bytes))  # no frame over the limit
        self.max_frame_bytes = max_frame_bytes
        self.linger_ms = linger_ms
        self._ctx = zmq.Context()
        size_context(self._ctx)    # libzmq's default 1023 sockets: a manager of ~340 members
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
        # and for HANDSHAKE_S at most (libzmq's default: 30 s); a member's handshake takes
        # milliseconds, and a dialer whose handshake was cut dials again
        self._router.handshake_ivl = int(HANDSHAKE_S * 1000)
        security.apply_server(self._router)
        try:
            self._router.bind(bind)
        except zmq.ZMQError as exc:
            self._router.close(linger=0)
            if self._auth is not None:
                self._auth.stop()
            self._ctx.term()
            raise bind_refused(bind, exc) from None
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

    def close(self, linger_ms: int | None = None, *, why: str = "") -> None:
        """Stop the loop, fail pending requests and close every socket (idempotent).

        ``linger_ms`` (default: the node's) bounds how long unsent messages may delay it.
        ``why``, where given, ends the NodeLost of every later call ("node X is closed: ...").
        Called from a handler (the I/O thread), the sockets close when the handler returns."""
        if self._closed.is_set():
            return
        if why:
            self._dir.closed_why = f"is closed: {why}"
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
        nexts.append(None if deadline is None else on_grid(deadline))
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


def _default_liveness() -> LivenessTimes:
    defaults = Config()
    return LivenessTimes.of(defaults.heartbeat_interval_s, defaults.dead_after_s,
                            defaults.silent_dead_after_s)

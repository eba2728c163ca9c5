"""Direct replies: a thread that waits for its replies receives them itself.

A request normally goes out over the node's link to ``dest`` and its reply comes back to this
node's ROUTER, whose I/O thread resolves the future and wakes the waiting thread: two thread
wake-ups before the caller runs again. A *direct* request (``Node.request(..., direct=True)``)
goes out over a DEALER of the calling thread's own, connected to ``dest``'s ROUTER under a
routing id of its own (``<node id>\\0<n>``). When ``dest`` answers on its I/O thread (a core
handler, a service's quick kind), the reply goes back out of its ROUTER over that connection,
and the calling thread, waiting in ``Node.wait``, reads it off its socket itself. A reply
made on another thread of ``dest`` goes over the link as usual (only the I/O thread uses the
ROUTER).

Security is unchanged. The thread's DEALER is a CURVE client of the cluster's key (under ipc,
an endpoint in the private directory), so only a member can answer on it; ``dest`` checks the
routing id's node part against the header's sender, as for every message; and a reply is taken
only for a pending request, only from the node that request was sent to (the request table's
check), only of a reply kind.

Failures reach the waiting thread as before: a dead node, a deadline or the node closing fail
the future from another thread, and its done callback wakes the waiter (a pipe it polls
beside its sockets). A reply ``dest`` could not route back (the connection not up yet, a full
queue) comes the usual way, through the I/O thread, and wakes the waiter the same way.

A thread's sockets (one per destination) are opened on first use and kept: a task pool's
threads live as long as their node. There are at most ``MAX_SOCKETS`` per node (beyond that,
requests go the usual way); a thread closes its socket to a node that died at its next direct
request, and the node closes them all when it closes.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import os
import threading
import time
from typing import Callable, Iterable

import zmq

from actorpy.errors import ProtocolError
from actorpy.ids import NodeId
from actorpy.runtime.directory import write
from actorpy.runtime.loop import MAX_POLL_MS
from actorpy.runtime.reply import ReplyFuture, wait_limit
from actorpy.wire import header as hdr
from actorpy.wire import message as wm
from actorpy.wire.auth import Security
from actorpy.wire.kinds import is_reply

log = logging.getLogger(__name__)

#: thread sockets one node keeps open at most
MAX_SOCKETS = 64
#: separates the node id from the thread's number in a direct routing id (node ids are
#: printable ASCII, so a routing id with it cannot be a node's own)
SEPARATOR = b"\x00"


def split_route(routing_id: bytes) -> tuple[bytes, bool]:
    """The node part of a routing id, and whether it names a thread's socket.

    >>> split_route(b"w-1"), split_route(b"w-1\\x003")
    ((b'w-1', False), (b'w-1', True))
    """
    node, sep, _ = routing_id.partition(SEPARATOR)
    return node, bool(sep)


class _Thread:
    """One thread's sockets and its wake-up pipe.

    ``lock`` is held while the sockets are used (by their thread, or by the node closing
    them); ``fd_lock`` guards the pipe's lifetime, so a late done callback never writes to
    a descriptor number that was closed and reused."""

    __slots__ = ("owner", "lock", "fd_lock", "socks", "poller", "wake_r", "wake_w", "closed")

    def __init__(self) -> None:
        self.owner = threading.get_ident()
        self.lock = threading.Lock()
        self.fd_lock = threading.Lock()
        self.socks: dict[NodeId, zmq.Socket] = {}
        self.poller = zmq.Poller()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.poller.register(self.wake_r, zmq.POLLIN)
        self.closed = False

    def poke(self, _: object = None) -> None:
        """Wake the thread if it waits (a future completed on another thread)."""
        if threading.get_ident() == self.owner:
            return
        with self.fd_lock:
            if self.closed:
                return
            try:
                os.write(self.wake_w, b"\0")
            except BlockingIOError:   # the pipe is full: a wake-up is pending anyway
                pass

    def drain(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass


class DirectReplies:
    """The thread sockets of one node (see the module docstring).

    Args:
        ctx: the node's ZeroMQ context.
        security: applied to every socket (CURVE client of the cluster's key).
        node_id: this node's id.
        max_frame_bytes: the largest frame a reply may have.
        address_of: where a node listens (None: not known yet).
        is_dead: whether a node is dead.
        resolve: completes the future a reply answers (checks request id and sender).
    """

    def __init__(self, ctx: zmq.Context, security: Security, node_id: NodeId,
                 max_frame_bytes: int, address_of: Callable[[NodeId], str | None],
                 is_dead: Callable[[NodeId], bool],
                 resolve: Callable[[wm.Message], None]) -> None:
        self._ctx, self._security, self._node_id = ctx, security, node_id
        self._max_frame_bytes = max_frame_bytes
        self._address_of, self._is_dead, self._resolve = address_of, is_dead, resolve
        self._local = threading.local()
        self._lock = threading.Lock()
        self._threads: list[_Thread] = []
        self._sockets = 0
        self._next_id = 0
        self._closed = False

    @property
    def sockets(self) -> int:
        """Thread sockets open now (for tests)."""
        return self._sockets

    # ------------------------------------------------------------------ sending
    def send(self, dest: NodeId, frames: list) -> bool:
        """Send a request's frames to ``dest`` over the calling thread's socket; False when
        it cannot go that way (the caller sends it over the link instead)."""
        mine = self._mine(create=True)
        if mine is None:
            return False
        with mine.lock:
            if mine.closed:
                return False
            sock = mine.socks.get(dest)
            if sock is None:
                sock = self._open(mine, dest)
                if sock is None:
                    return False
            try:
                return write(sock, frames)
            except zmq.ZMQError as exc:
                log.debug("direct request to %s failed (%s); sent over the link", dest, exc)
                return False

    def _mine(self, create: bool) -> _Thread | None:
        mine: _Thread | None = getattr(self._local, "thread", None)
        if mine is None and create:
            with self._lock:
                if self._closed:
                    return None
                mine = _Thread()
                self._threads.append(mine)
            self._local.thread = mine
        return mine

    def _open(self, mine: _Thread, dest: NodeId) -> zmq.Socket | None:
        """The calling thread's socket to ``dest``, opened now (its lock held); None when
        ``dest``'s address is unknown or this node has MAX_SOCKETS open."""
        for gone in [d for d in mine.socks if self._is_dead(d)]:
            self._close_socket(mine, gone)
        address = self._address_of(dest)
        if address is None:
            return None
        with self._lock:
            if self._closed or self._sockets >= MAX_SOCKETS:
                return None
            self._sockets += 1
            self._next_id += 1
            routing_id = hdr.sender_bytes(self._node_id) + SEPARATOR + b"%d" % self._next_id
        try:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, routing_id)
            sock.linger = 0
            sock.maxmsgsize = self._max_frame_bytes + hdr.HEADER_BYTES + wm.INLINE_MAX_BYTES
            self._security.apply_client(sock)
            sock.connect(address)
        except zmq.ZMQError as exc:
            with self._lock:
                self._sockets -= 1
            log.debug("no direct socket to %s: %s", dest, exc)
            return None
        mine.socks[dest] = sock
        mine.poller.register(sock, zmq.POLLIN)
        return sock

    def _close_socket(self, mine: _Thread, dest: NodeId) -> None:
        sock = mine.socks.pop(dest)
        mine.poller.unregister(sock)
        sock.close(linger=0)
        with self._lock:
            self._sockets -= 1

    # ------------------------------------------------------------------ waiting
    def wait(self, futures: Iterable[ReplyFuture], timeout_s: float | None
             ) -> set[ReplyFuture]:
        """Wait until one of ``futures`` is done (at most ``timeout_s``); returns the done
        ones (empty: the time ran out). Replies on the calling thread's sockets are read
        here, by this thread."""
        futures = list(futures)
        timeout_s = wait_limit(timeout_s)
        mine = self._mine(create=False)
        if mine is None or mine.closed:
            return set(cf.wait(futures, timeout_s, cf.FIRST_COMPLETED).done)
        for fut in futures:
            fut.add_done_callback(mine.poke)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            done = {f for f in futures if f.done()}
            if done:
                return done
            if deadline is None:
                wait_ms = None
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return set()
                wait_ms = min(max(1, math.ceil(left * 1000)), MAX_POLL_MS)
            with mine.lock:
                closing = mine.closed or self._closed
                if not closing:
                    events = dict(mine.poller.poll(wait_ms))
                    if mine.wake_r in events:
                        mine.drain()
                    for dest, sock in list(mine.socks.items()):
                        if sock in events:
                            self._receive(sock, dest)
            if closing:   # the node closes: its futures fail (not holding the lock)
                left_s = None if deadline is None else max(0.0, deadline - time.monotonic())
                return set(cf.wait(futures, left_s, cf.FIRST_COMPLETED).done)

    def _receive(self, sock: zmq.Socket, dest: NodeId) -> None:
        """Take every reply waiting on ``sock`` (its thread's lock held)."""
        while sock.get(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                msg = wm.Message.parse(frames, self._max_frame_bytes)
            except ProtocolError as exc:
                log.warning("dropped a direct reply from %s: %s", dest, exc)
                continue
            if not is_reply(msg.header.service, msg.header.kind):
                log.warning("dropped a message of kind %d from %s on a direct reply socket: "
                            "only replies come that way", msg.header.kind, dest)
                continue
            self._resolve(msg)

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Close every thread's sockets and pipe (idempotent). A thread waiting in ``wait``
        is woken first; its futures have failed already (the node fails them all)."""
        with self._lock:
            self._closed = True
            threads, self._threads = self._threads, []
        for mine in threads:
            mine.poke()
            with mine.lock:
                for dest in list(mine.socks):
                    self._close_socket(mine, dest)
                with mine.fd_lock:
                    mine.closed = True
                    os.close(mine.wake_r)
                    os.close(mine.wake_w)

"""The ``Node``'s messaging calls: send (over a peer's link, to this node itself, or as a
direct reply out of the ROUTER), request with a deadline, wait, call, reply.

``NodeMessaging`` is a part of ``actorpy.runtime.node.Node`` (a mixin with no state of its
own): messages are assembled in the caller's thread and go out through the node's
``directory.Directory``, ``direct.DirectReplies`` or loopback queue; pending requests live in
its ``requests.RequestTable``.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Any, Callable

import zmq

from actorpy.errors import AuthError, ConfigError, NodeLost
from actorpy.ids import NodeId
from actorpy.runtime import remote
from actorpy.runtime.direct import DirectReplies
from actorpy.runtime.directory import Directory, write
from actorpy.runtime.liveness import Verdict
from actorpy.runtime.loop import SocketLoop
from actorpy.runtime.node_peers import not_listening
from actorpy.runtime.receive import Receiver
from actorpy.runtime.reply import ReplyFuture
from actorpy.runtime.requests import RequestTable
from actorpy.wire import message as wm
from actorpy.wire.kinds import CORE_SERVICE, REPLY_KINDS, Kind

# Logged under the node's name, as before this part moved out of node.py.
log = logging.getLogger("actorpy.runtime.node")

#: request deadlines are checked on this grid, so a stream of requests does not wake the
#: loop once per request (a deadline fires at most this late)
DEADLINE_GRID_S = 0.05
#: a message to this node itself is never cut into frames (nor held to a frame limit)
_LOOPBACK_CHUNK_BYTES = 1 << 62


class NodeMessaging:
    """Sending, requests and replies of a ``Node`` (see ``actorpy.runtime.node``)."""

    node_id: NodeId
    chunk_bytes: int
    max_frame_bytes: int
    _sender: bytes
    _closed: threading.Event
    _router: zmq.Socket
    _loop: SocketLoop
    _dir: Directory
    _direct: DirectReplies
    _receiver: Receiver
    _requests: RequestTable
    _auth_failures: dict[NodeId, str]
    _loopback: deque[wm.Message]
    _planned_tick: float | None
    _guard: Callable[[Callable[[], None]], None]
    link_verdict: Callable[[NodeId], Verdict | None]

    def send(self, dest: NodeId, service: int, kind: int, payload: Any = wm.NO_PAYLOAD, *,
             request_id: int = 0, step: int = 0, from_service: int = 0,
             snapshot: bool = False, route: bytes | None = None, share: bool = False) -> None:
        """Send one message (thread-safe; serializes in the calling thread).

        When ``dest`` does not keep up, this waits until its queue has room (the I/O thread
        never waits). numpy/torch buffers in ``payload`` are sent without copying: do not
        modify them until the request they belong to has been answered (or pass
        ``snapshot=True``: they are copied first, see ``wire.message.assemble``).
        ``from_service`` names the sending service on this node (0: the node itself);
        receivers see it as ``msg.from_service``. ``route`` (a reply's: the request's
        ``msg.route``) sends it back to the thread that asked for a direct reply. ``share``:
        the caller's arrays never change (``Reply.send``'s promise), so a receiver on this
        node gets read-only views of them rather than copies, as one elsewhere gets the
        read-only frames it received.

        Raises:
            SerializationError: the payload cannot be pickled or cannot fit max_frame_bytes.
        """
        if self._closed.is_set():
            raise NodeLost(self.node_id, f"node {self.node_id} {self._dir.closed_why}")
        if dest == self.node_id:
            # Loopback copies every frame before this returns, so no snapshot first (a
            # reply's arrays were copied twice), and arrays are not cut into the wire's
            # chunks (the receiver would join them with another copy): one copy in all.
            self._send_to_self(wm.assemble(service, kind, self._sender, payload,
                                           request_id=request_id, step=step,
                                           chunk_bytes=_LOOPBACK_CHUNK_BYTES,
                                           from_service=from_service), share)
            return
        frames = wm.assemble(service, kind, self._sender, payload, request_id=request_id,
                             step=step, chunk_bytes=self.chunk_bytes,
                             max_frame_bytes=self.max_frame_bytes, snapshot=snapshot,
                             from_service=from_service)
        if route is not None:
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

    def _send_to_self(self, frames: list[Any], share: bool = False) -> None:
        """Loopback: a message to this node is dispatched as if received. The frames are
        copied, so the receiver never shares a buffer with the sender (as on the wire), and
        nothing is decoded here; with ``share`` (arrays that never change) they are
        read-only views instead (a 4 MB reply's copy held the interpreter lock ~1 ms). A
        reply, or a message for a service, is dispatched at once on the sending thread
        (resolving a future and offering to an inbox are thread-safe; a service's quick
        kind may run right here): no hand-off to the I/O thread and back. Messages for the
        node's own handlers go through the I/O thread, where those run."""
        # (bytes are immutable: shared, not copied; no frame limit, as no wire is crossed)
        copied = [f if type(f) is bytes else memoryview(f).cast("B").toreadonly() if share
                  else wm.copy_frame(f) for f in frames]
        msg = wm.Message.parse(copied, _LOOPBACK_CHUNK_BYTES)
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
            self._requests.fail(fut, NodeLost(dest, not_listening(
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
                if dest == self.node_id and fut.done():
                    # answered on this very thread by a service here: a thread that sends
                    # such requests in a loop never waits, and would keep the I/O thread
                    # from other nodes' messages (SocketLoop.let_run)
                    self._loop.let_run()
        except BaseException:
            self._requests.discard(fut)
            raise
        return fut

    def _send_direct(self, dest: NodeId, service: int, kind: int, payload: Any, rid: int,
                     step: int, from_service: int) -> None:
        if self._closed.is_set():
            raise NodeLost(self.node_id, f"node {self.node_id} {self._dir.closed_why}")
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

    def _deadline_added(self, deadline: float) -> None:
        planned = self._planned_tick
        if planned is None or on_grid(deadline) < planned:
            if not self._loop.in_loop():
                self._loop.wake()


def on_grid(t: float) -> float:
    """``t`` rounded up to the deadline grid (when the loop next looks at deadlines)."""
    return math.ceil(t / DEADLINE_GRID_S) * DEADLINE_GRID_S

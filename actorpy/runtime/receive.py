"""A node's receive path, run on its I/O thread: drain the ROUTER, authenticate, validate,
then ``dispatch`` — one function that routes every message: a reply to its future, else the
handler of ``(service, kind)``, else the service sink, else an ERROR reply naming what is
missing (so a caller never waits for its timeout on a service that is not there).

Member garbage (a payload that fails to decode in a handler) is one WARNING, not a
traceback; a failing handler is logged with its traceback; nothing stops the loop.
"""
from __future__ import annotations

import errno
import logging
import re
import struct
from typing import Any, Callable

import zmq

from actorpy.errors import ActorpyError, ProtocolError
from actorpy.log import Throttle
from actorpy.runtime.direct import split_route
from actorpy.runtime.requests import RequestTable
from actorpy.wire import message as wm
from actorpy.wire import serde
from actorpy.wire.auth import Security
from actorpy.wire.kinds import CORE_SERVICE, Kind, is_reply

log = logging.getLogger(__name__)

Handler = Callable[[wm.Message], None]

#: messages taken from the ROUTER per wake-up (so timers still run under a flood)
DRAIN_BATCH = 1000
# pyzmq's flags as plain ints: its enum operators cost more than the check they serve, on
# every message
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)
_DECODE_CODE = frozenset(c for c in (
    getattr(getattr(wm.Message, "payload", None), "__code__", None),
    serde.decode.__code__, serde.loads.__code__) if c is not None)
_EVENT = struct.Struct("=HI")  # a monitor event's first frame: event id, value
_NUMBERS, _QUOTED = re.compile(r"\d+"), re.compile(r"['\":(]")


def decode_payload(msg: wm.Message, what: str) -> Any:
    """``msg.payload()``, or ProtocolError naming ``what`` and the sender if it does not decode
    (a core handler then logs one WARNING, not a traceback)."""
    try:
        return msg.payload()
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - unpickling garbage raises nearly anything
        raise ProtocolError(f"{what} from {msg.sender!r} does not decode: "
                            f"{type(exc).__name__}: {exc}") from None


class Receiver:
    """Everything a node does with what arrives on its ROUTER.

    Args:
        node_id: the node's id (for messages).
        security: decides which frames come from members.
        max_frame_bytes: frames above this are dropped with a WARNING.
        requests: where replies find their futures.
        reply_error: answers a request with an exception.
    """

    def __init__(self, node_id: str, security: Security, max_frame_bytes: int,
                 requests: RequestTable,
                 reply_error: Callable[[wm.Message, BaseException], None]) -> None:
        self.node_id, self.security, self.max_frame_bytes = node_id, security, max_frame_bytes
        self._requests, self._reply_error = requests, reply_error
        self.handlers: dict[tuple[int, int], Handler] = {}
        self.service_sink: Callable[[wm.Message], bool] | None = None
        self._throttle = Throttle()
        #: bytes received so far (all frames)
        self.bytes_in = 0

    def drain(self, router: zmq.Socket) -> None:
        for _ in range(DRAIN_BATCH):
            # Asking first costs no exception, and no release of the interpreter lock (a
            # receive releases it, and another thread of the process may then keep it).
            if not router.get(_EVENTS) & _POLLIN:
                return
            try:
                frames = router.recv_multipart(_NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                self.receive(frames)
            except Exception:  # never let one message stop the loop
                log.exception("node %s failed to process a message", self.node_id)

    def receive(self, frames: list[zmq.Frame]) -> None:
        routing_id = frames[0].bytes
        self.bytes_in += sum(len(f) for f in frames)
        node_part, direct = split_route(routing_id)
        who = node_part.decode("ascii", "replace")
        if not self.security.is_trusted(frames[0]):
            self._throttle.log(log, (who, "untrusted"), "dropped a message from %r: sender is "
                               "not an authenticated member", who)
            return
        try:
            msg = wm.Message.parse(frames[1:], self.max_frame_bytes)
        except ProtocolError as exc:
            # throttled per sender and cause: a node of another release says so with every
            # heartbeat, and each line was a message before
            self._throttle.log(log, (who, cause(exc)), "dropped a message from %r: %s", who,
                               exc)
            return
        if msg.sender != who:
            self._throttle.log(log, (who, "impostor"), "dropped a message from %r: it claims "
                               "to come from %r", who, msg.sender)
            return
        if direct:
            msg.route = routing_id
        self.dispatch(msg)

    def dispatch(self, msg: wm.Message) -> None:
        """Route one authenticated, validated message: a reply to its future, else to the
        handler of ``(service, kind)``, else to the service sink, else an ERROR reply."""
        service, kind = msg.header.service, msg.header.kind
        if is_reply(service, kind):
            self.resolve(msg)
            return
        handler = self.handlers.get((service, kind))
        if handler is not None:
            self._run_handler(handler, msg)
        elif service != CORE_SERVICE and self.service_sink is not None \
                and self.service_sink(msg):
            return
        elif service != CORE_SERVICE:
            self._refuse(msg, f"no service {service} on node {self.node_id} (it was stopped, "
                              "or never started here)")
        else:
            self._refuse(msg, f"node {self.node_id} has no handler for kind {kind} of service "
                              f"{service}")

    def resolve(self, msg: wm.Message) -> None:
        """Complete the future a reply answers, if it was sent to the reply's sender."""
        rid = msg.header.request_id
        fut, ours = self._requests.take(rid, msg.sender)
        if fut is None:
            log.debug("late or unknown reply %d from %s", rid, msg.sender)
        elif not ours:
            log.warning("dropped a reply from %r: request %d was sent to %r", msg.sender, rid,
                        fut.dest)
        elif msg.kind == Kind.RESULT:
            fut.set_reply(msg)
        else:
            fut.set_failure(msg)

    def _run_handler(self, handler: Handler, msg: wm.Message) -> None:
        try:
            handler(msg)
        except Exception as exc:  # a broken handler must not stop the node
            key = (msg.sender, msg.header.service, msg.kind)
            if isinstance(exc, ProtocolError):
                self._throttle.log(log, key, "dropped a message from %r (kind %d of service "
                                   "%d): %s", msg.sender, msg.kind, msg.header.service, exc)
            elif _raised_decoding(exc):
                self._throttle.log(log, key, "dropped a message from %r (kind %d of service "
                                   "%d): its payload does not decode: %s: %s", msg.sender,
                                   msg.kind, msg.header.service, type(exc).__name__, exc)
            else:
                self._throttle.log(log, key, "callback failed on node %s for kind %d of "
                                   "service %d from %r", self.node_id, msg.kind,
                                   msg.header.service, msg.sender, level=logging.ERROR,
                                   exc_info=True)

    def _refuse(self, msg: wm.Message, text: str) -> None:
        """No one here takes ``msg``: a request gets an ERROR naming why; a cast a WARNING."""
        if not msg.header.request_id:
            self._throttle.log(log, (msg.sender, msg.header.service), "dropped a message "
                               "from %r: %s", msg.sender, text)
            return
        log.debug("refused a request from %r: %s", msg.sender, text)
        try:
            self._reply_error(msg, ActorpyError(text))
        except ActorpyError as exc:
            log.debug("could not refuse %r: %s", msg.sender, exc)

    def log_handshake_failures(self, monitor: zmq.Socket, address: str) -> None:
        """Report connections the ROUTER refused (CURVE: wrong mechanism or key)."""
        while True:
            try:
                frames = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            if len(frames[0]) != _EVENT.size:
                continue
            event, value = _EVENT.unpack(frames[0])
            self._throttle.log(log, event, "rejected a connection to %s: %s", address,
                               _handshake_failure(event, value))


def _handshake_failure(event: int, value: int) -> str:
    """What a failed handshake says about the other side. Only an AUTH failure is a wrong
    key (the ZAP handler logs that key too); NO_DETAIL is a connection that broke off or
    stalled mid-handshake (a member paused for seconds, say), not an outsider."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (f"its key was refused (ZAP status {value}): it is not a member of this "
                "cluster (wrong or missing secret)")
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and \
            value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return ("its handshake could not be decrypted: it is not a member of this cluster "
                "(wrong or missing secret)")
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return (f"it broke the protocol in its handshake (code 0x{value:x}): it speaks "
                "another protocol (not ZMTP with CURVE), or is no actorpy node")
    reason = errno.errorcode.get(value, f"code 0x{value:x}")
    return (f"its handshake did not complete ({reason}): it went away, stalled (a paused "
            "process), or does not speak this protocol")


def cause(exc: BaseException) -> str:
    """What kind of failure ``exc`` is, for throttling its reports: its words up to the first
    quote, colon or parenthesis, numbers blanked (a hostile sender's bytes would make each
    report new).

    >>> cause(ProtocolError("protocol version 9, this node speaks 2"))
    'protocol version #, this node speaks #'
    >>> cause(ProtocolError("bad magic b'\\x8f'")) == cause(ProtocolError("bad magic b'7'"))
    True
    """
    return _QUOTED.split(_NUMBERS.sub("#", str(exc)), 1)[0][:80]


def _raised_decoding(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while unpickling a payload (a member sent garbage)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in _DECODE_CODE:
            return True
        tb = tb.tb_next
    return False

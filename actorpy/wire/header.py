"""The fixed header frame that starts every message (pure: no sockets; fuzzed in tests).

Layout (network byte order, 46 bytes)::

    magic "AP" | version u8 | flags u8 | service u16 | from_service u16 | kind u16 |
    request_id u64 | step i64 | sender 16 bytes (ASCII node id, NUL padded) | nframes u32

``service`` is the service the message is for on the receiving node; ``from_service`` the
service that sent it on the sending node (0: the node itself, e.g. a driver or a task), so a
receiver can tell apart several services of one node (several P2P peers per worker).
``nframes`` counts the payload frames after the header, so a truncated message is detected
before anything is unpickled.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from actorpy.errors import ProtocolError
from actorpy.wire.kinds import CORE_SERVICE, PROTOCOL_VERSION, Kind

MAGIC = b"AP"
_STRUCT = struct.Struct("!2sBBHHHQq16sI")
HEADER_BYTES = _STRUCT.size
SENDER_BYTES = 16

#: flags bit: the payload frames carry out-of-band buffers (body, layout, chunks...).
FLAG_BUFFERS = 0x01
#: flags bit: a small pickled body follows the header inside the header frame (one frame
#: per small message instead of two: each frame costs a ZeroMQ message, and under CURVE a
#: separate encryption).
FLAG_INLINE = 0x02
_KNOWN_FLAGS = FLAG_BUFFERS | FLAG_INLINE
_CORE_KINDS = frozenset(int(k) for k in Kind)
_PRINTABLE = bytes(range(0x21, 0x7F))


class Header(NamedTuple):
    """One message's header.

    >>> h = Header(service=0, kind=Kind.TASK, sender="w-1", request_id=7, step=3, nframes=1,
    ...            from_service=4)
    >>> decode(h.encode()) == h
    True
    """

    service: int
    kind: int
    sender: str
    request_id: int = 0
    step: int = 0
    nframes: int = 0
    flags: int = 0
    version: int = PROTOCOL_VERSION
    from_service: int = 0

    def encode(self) -> bytes:
        return encode(self.service, self.kind, sender_bytes(self.sender), self.request_id,
                      self.step, self.nframes, self.flags, self.version, self.from_service)


def sender_bytes(sender: str) -> bytes:
    """A node id as the header carries it (checked once, so senders can cache it).

    Raises:
        ProtocolError: the id is not printable ASCII or longer than 16 bytes.
    """
    try:
        raw = sender.encode("ascii")
    except UnicodeEncodeError:
        raise ProtocolError(f"sender id {sender!r} is not ASCII") from None
    if len(raw) > SENDER_BYTES:
        raise ProtocolError(f"sender id {sender!r} longer than {SENDER_BYTES} bytes")
    if not raw or raw.translate(None, _PRINTABLE):
        raise ProtocolError(f"sender id {sender!r} must be printable ASCII, without spaces")
    return raw


def encode(service: int, kind: int, sender: bytes, request_id: int = 0, step: int = 0,
           nframes: int = 0, flags: int = 0, version: int = PROTOCOL_VERSION,
           from_service: int = 0) -> bytes:
    """Pack a header without building a Header first (the send path's fast lane).

    Raises:
        ProtocolError: a field is out of its range.
    """
    try:
        return _STRUCT.pack(MAGIC, version, flags, service, from_service, int(kind), request_id,
                            step, sender, nframes)
    except struct.error as exc:
        raise ProtocolError(f"header field out of range: {exc}") from None


def decode(data: bytes | memoryview) -> Header:
    """Parse and validate a header frame.

    Raises:
        ProtocolError: wrong size, magic or version, unknown flags, an unknown core kind,
            or a sender id that is not printable ASCII.
    """
    if len(data) < HEADER_BYTES:
        raise ProtocolError(f"header is {len(data)} bytes, expected {HEADER_BYTES}")
    magic, version, flags, service, from_service, kind, request_id, step, sender, nframes = \
        _STRUCT.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version}, this node speaks {PROTOCOL_VERSION}")
    if flags & ~_KNOWN_FLAGS:
        raise ProtocolError(f"unknown flags 0x{flags:02x}")
    if len(data) != HEADER_BYTES and not flags & FLAG_INLINE:
        raise ProtocolError(f"header is {len(data)} bytes, expected {HEADER_BYTES}")
    if flags & FLAG_INLINE and (flags & FLAG_BUFFERS or nframes or len(data) == HEADER_BYTES):
        raise ProtocolError("inline body flag with buffers, extra frames or no body")
    if service == CORE_SERVICE and kind not in _CORE_KINDS:
        raise ProtocolError(f"unknown core message kind {kind}")
    raw = sender.rstrip(b"\0")
    if not raw or raw.translate(None, _PRINTABLE):
        raise ProtocolError("sender id is empty or not printable ASCII")
    return Header(service=service, kind=kind, sender=raw.decode("ascii"), request_id=request_id,
                  step=step, nframes=nframes, flags=flags, version=version,
                  from_service=from_service)

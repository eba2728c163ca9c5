"""The fixed header frame that starts every message (pure: no sockets; fuzzed in tests).

Layout (network byte order, 44 bytes)::

    magic "AP" | version u8 | flags u8 | service u16 | kind u16 |
    request_id u64 | step i64 | sender 16 bytes (ASCII node id, NUL padded) | nframes u32

``nframes`` counts the payload frames after the header, so a truncated message is detected
before anything is unpickled.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from actorpy.errors import ProtocolError
from actorpy.wire.kinds import CORE_SERVICE, PROTOCOL_VERSION, Kind

MAGIC = b"AP"
_STRUCT = struct.Struct("!2sBBHHQq16sI")
HEADER_BYTES = _STRUCT.size
SENDER_BYTES = 16

#: flags bit: the payload frames carry out-of-band buffers (body, layout, chunks...).
FLAG_BUFFERS = 0x01
_KNOWN_FLAGS = FLAG_BUFFERS
_CORE_KINDS = frozenset(int(k) for k in Kind)


@dataclass(frozen=True, slots=True)
class Header:
    """One message's header.

    >>> h = Header(service=0, kind=Kind.TASK, sender="w-1", request_id=7, step=3, nframes=1)
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

    def encode(self) -> bytes:
        sender = self.sender.encode("ascii")
        if len(sender) > SENDER_BYTES:
            raise ProtocolError(f"sender id {self.sender!r} longer than {SENDER_BYTES} bytes")
        return _STRUCT.pack(MAGIC, self.version, self.flags, self.service, int(self.kind),
                            self.request_id, self.step, sender, self.nframes)


def decode(data: bytes | memoryview) -> Header:
    """Parse and validate a header frame.

    Raises:
        ProtocolError: wrong size, magic or version, unknown flags, an unknown core kind,
            or a sender id that is not printable ASCII.
    """
    if len(data) != HEADER_BYTES:
        raise ProtocolError(f"header is {len(data)} bytes, expected {HEADER_BYTES}")
    magic, version, flags, service, kind, request_id, step, sender, nframes = _STRUCT.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version}, this node speaks {PROTOCOL_VERSION}")
    if flags & ~_KNOWN_FLAGS:
        raise ProtocolError(f"unknown flags 0x{flags:02x}")
    if service == CORE_SERVICE and kind not in _CORE_KINDS:
        raise ProtocolError(f"unknown core message kind {kind}")
    raw = sender.rstrip(b"\0")
    if not raw or not all(0x21 <= b < 0x7F for b in raw):
        raise ProtocolError("sender id is empty or not printable ASCII")
    return Header(service=service, kind=kind, sender=raw.decode("ascii"), request_id=request_id,
                  step=step, nframes=nframes, flags=flags, version=version)

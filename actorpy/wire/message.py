"""Messages as they travel: frame assembly for sending, validation and lazy decoding on receipt."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actorpy.errors import ActorpyError, ProtocolError, SerializationError
from actorpy.wire import header as hdr
from actorpy.wire import serde

#: Sentinel: a message without payload frames.
NO_PAYLOAD: Any = object()

#: Pickled bodies up to this size travel inside the header frame (arrays up to
#: serde.IN_BAND_MAX_BYTES are inside the body, so a message with one is one frame).
INLINE_MAX_BYTES = 32 << 10

#: Frames smaller than this are copied into ZeroMQ (cheaper than tracking them).
ZERO_COPY_MIN_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class Encoded:
    """A payload already serialized: reusable across sends (e.g. a stored shuffle block).

    ``Encoded.of`` keeps views of the value's arrays (no copy); ``snapshot()`` gives an
    Encoded that owns its bytes, unaffected by later changes to those arrays.
    ``has_buffers`` says the frames start with a layout frame (see serde.encode)."""

    frames: tuple[Any, ...]
    has_buffers: bool

    @classmethod
    def of(cls, value: Any, chunk_bytes: int = serde.DEFAULT_CHUNK_BYTES) -> Encoded:
        frames, has_buffers = serde.encode(value, chunk_bytes)
        return cls(tuple(frames), has_buffers)

    @property
    def nbytes(self) -> int:
        return sum(memoryview(f).nbytes for f in self.frames)

    def snapshot(self) -> Encoded:
        """The same frames in memory of their own: each frame that views memory someone else
        may change (an array, a bytearray) is copied once; views of immutable bytes are kept."""
        return Encoded(tuple(_owned(f) for f in self.frames), self.has_buffers)

    def decode(self) -> Any:
        return serde.decode(self.frames, self.has_buffers)


def _owned(frame: Any) -> Any:
    if isinstance(frame, bytes) or isinstance(memoryview(frame).obj, bytes):
        return frame
    return copy_frame(frame)


def copy_frame(frame: Any) -> bytes | memoryview:
    """A copy of one (contiguous) frame that nothing else can change: ``bytes`` under
    ``ZERO_COPY_MIN_BYTES``, else a read-only view of a copy numpy made without the
    interpreter lock (``bytes()`` kept it, and the process's other threads, its I/O thread
    with another node's message, waited behind a run of 4 MB copies)."""
    view = memoryview(frame).cast("B")
    if view.nbytes < ZERO_COPY_MIN_BYTES:
        return bytes(view)
    import numpy as np   # loaded already: the large frames are arrays' (serde)

    return memoryview(np.frombuffer(view, dtype=np.uint8).copy()).toreadonly()


def assemble(service: int, kind: int, sender: str | bytes, payload: Any = NO_PAYLOAD, *,
             request_id: int = 0, step: int = 0,
             chunk_bytes: int = serde.DEFAULT_CHUNK_BYTES,
             max_frame_bytes: int | None = None, snapshot: bool = False,
             from_service: int = 0) -> list[Any]:
    """All frames of one message: header first, then the payload's frames.

    ``sender`` may be pre-checked bytes from ``header.sender_bytes`` (nodes cache theirs);
    ``from_service`` is the sending service's id on its node (0: the node itself).
    With ``max_frame_bytes`` no frame is made larger (bodies and buffers are split to fit).
    With ``snapshot`` the payload's arrays are copied (see ``Encoded.snapshot``), so the
    caller may change them as soon as this returns (replies use it: nothing tells a replier
    when its reply has left).

    Raises:
        SerializationError: the payload cannot be pickled, or a frame cannot be made to fit
            ``max_frame_bytes`` (an Encoded built with bigger chunks, or a limit below the
            header's size).
    """
    sender_raw = sender if isinstance(sender, bytes) else hdr.sender_bytes(sender)
    limit = max_frame_bytes if max_frame_bytes is not None else 1 << 62
    if payload is NO_PAYLOAD:
        frames = [hdr.encode(service, kind, sender_raw, request_id, step, 0, 0,
                             from_service=from_service)]
    else:
        if isinstance(payload, Encoded):
            enc = payload
        else:
            enc = Encoded.of(payload, max(1, min(chunk_bytes, limit)))
            if snapshot:
                enc = enc.snapshot()
        body = enc.frames
        if (not enc.has_buffers and len(body[0]) <= INLINE_MAX_BYTES
                and hdr.HEADER_BYTES + len(body[0]) <= limit):
            return [hdr.encode(service, kind, sender_raw, request_id, step, 0, hdr.FLAG_INLINE,
                               from_service=from_service) + body[0]]
        flags = hdr.FLAG_BUFFERS if enc.has_buffers else 0
        frames = [hdr.encode(service, kind, sender_raw, request_id, step, len(body), flags,
                             from_service=from_service), *body]
    if max_frame_bytes is not None:
        _check_sizes(frames, max_frame_bytes)
    return frames


def _check_sizes(frames: list[Any], max_frame_bytes: int) -> None:
    for frame in frames:
        size = memoryview(frame).nbytes
        if size > max_frame_bytes:
            raise SerializationError(
                f"cannot send a message with a {size}-byte frame: max_frame_bytes is "
                f"{max_frame_bytes} and the frame cannot be split further; raise "
                "max_frame_bytes (ACTORPY_MAX_FRAME_BYTES) on every node of the cluster")


#: A message's frames once ``payload(release=True)`` took them.
_RELEASED: list[Any] = []


@dataclass(slots=True)
class Message:
    """A received, validated message. ``payload()`` unpickles on demand (in the caller's
    thread, so a large payload never stalls the receive loop)."""

    header: hdr.Header
    frames: list[Any]
    #: the sender thread's own routing id when it asked for a direct reply
    #: (actorpy.runtime.direct): the reply goes back over the connection it came on
    route: bytes | None = None

    @property
    def sender(self) -> str:
        return self.header.sender

    @property
    def kind(self) -> int:
        return self.header.kind

    @property
    def from_service(self) -> int:
        """The sending service's id on the sender's node (0: the node itself)."""
        return self.header.from_service

    @property
    def has_payload(self) -> bool:
        return bool(self.frames)

    def payload(self, release: bool = False) -> Any:
        """The decoded payload (None if the message has none).

        With ``release`` the message lets go of its frames, each as soon as it is decoded
        (a buffer split over several frames is joined with one copy: each piece is freed
        once copied), so a large payload is not held twice while its handler runs. The
        payload cannot be read again then.

        Raises:
            ActorpyError: the payload was released already.
        """
        frames = self.frames
        if frames is _RELEASED:
            raise ActorpyError(f"the payload of a message of kind {self.kind} from "
                               f"{self.sender} was read with release=True already")
        if release:
            self.frames = _RELEASED
        if not frames:
            return None
        return serde.decode(frames, bool(self.header.flags & hdr.FLAG_BUFFERS), release)

    @classmethod
    def parse(cls, frames: list[Any], max_frame_bytes: int) -> Message:
        """Validate the frames of a received message (header, counts, sizes).

        Raises:
            ProtocolError: the message is malformed, truncated or oversize.
        """
        if not frames:
            raise ProtocolError("empty message")
        first = _bytes(frames[0])
        head = hdr.decode(first)
        if head.flags & hdr.FLAG_INLINE:
            if len(frames) != 1:
                raise ProtocolError(f"inline body but {len(frames) - 1} more frames")
            if len(first) > max_frame_bytes:
                raise ProtocolError(f"frame over the {max_frame_bytes}-byte limit")
            return cls(head, [memoryview(first)[hdr.HEADER_BYTES:]])
        body = frames[1:]
        if head.nframes != len(body):
            raise ProtocolError(f"header announces {head.nframes} payload frames, got {len(body)}")
        if head.flags & hdr.FLAG_BUFFERS and len(body) < 2:
            raise ProtocolError("buffer flag set but no buffer frames")
        for frame in body:
            if len(frame) > max_frame_bytes:
                raise ProtocolError(f"frame over the {max_frame_bytes}-byte limit")
        return cls(head, body)


def _bytes(frame: Any) -> bytes | memoryview:
    return frame.bytes if hasattr(frame, "bytes") else frame  # a 44-byte copy beats a view

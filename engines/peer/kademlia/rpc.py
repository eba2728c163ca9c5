"""The overlay's strict plain-values codec, with values out of band.

``encode(msg)`` gives a tuple of ints, floats, str, bytes and lists (no pickle needed):
``(version, kind, rpc_id, sender_id, step, *fields)``. A stored value appears in it only as a
descriptor ``[kind, dtype, shape]``; its bytes come from ``value_frames(msg)``, which the shell
sends as separate frames (zero-copy). ``decode(wire, frames)`` checks the version, kind,
arity, types, id lengths, sizes and the descriptor against its frame, and raises
``ProtocolError`` on anything off — whatever the sender put there (see ``brief``).

>>> msg = FindNode(rpc_id=7, sender_id=KadId(1), target=KadId(2), step=3)
>>> decode(encode(msg)) == msg
True
>>> encode(msg)[:3], encode(msg)[4]
((5, 5, 7), 3)
>>> store = Store(1, KadId(1), KadId(2), b"abc", ttl_s=60.0, clock=4)
>>> wire, frames = encode(store), value_frames(store)
>>> wire[6:9], [bytes(f) for f in frames]
(([0, '|u1', [3]], 60.0, 4), [b'abc'])
>>> decode(wire, frames).value.to_value()
b'abc'
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from actorpy.errors import ProtocolError
from actorpy.log import brief

from .ids import ID_SPACE, MAX_STEP, KadId, id_from_bytes, id_to_bytes
from .messages import (MESSAGE_TYPES, NO_STEP, REPLY_KINDS, REQUEST_KINDS, Call, FindNode,
                       FindValue, Kind, Leave, Message, Nodes, Ping, Pong, Reply, Step, Store,
                       Stored, Value)
from .routing import Contact
from .values import Blob, parse

__all__ = [
    "MESSAGE_TYPES", "NO_STEP", "REPLY_KINDS", "REQUEST_KINDS", "Call", "FindNode", "FindValue",
    "Kind", "Leave", "Message", "Nodes", "Ping", "Pong", "Reply", "Step", "Store", "Stored",
    "Value",
    "brief", "decode", "encode", "value_frames",
]

PROTOCOL_VERSION = 5          # 3: STEP; 4: STORE's base; 5: value stamps
MAX_CONTACTS = 64            # a NODES reply holds at most this many (nodes also cap at ksize)
MAX_VALUE_BYTES = 1 << 30    # values travel as their own frames; nodes set their own limit
MAX_ADDRESS_CHARS = 256
MAX_RPC_ID = (1 << 64) - 1
MAX_TTL_S = 1e9              # ~31 years; nodes cap it at their own ttl_s anyway
MAX_ARGS = 17                # CALL / REPLY: a few plain scalars
MAX_ARG_CHARS = 256
MAX_PEER_STEPS = 64          # REPLY: gossiped (id, step) pairs

WireMessage = tuple  # (version, kind, rpc_id, sender_id_bytes, step, *fields)


def encode(msg: Message) -> WireMessage:
    """Plain-values form of a message; a value is a descriptor (see ``value_frames``)."""
    head = (PROTOCOL_VERSION, int(msg.KIND), msg.rpc_id, id_to_bytes(msg.sender_id), msg.step)
    fields = _FIELDS.get(type(msg))
    return head if fields is None else head + fields(msg)


def _descriptor(value: Blob | None) -> list[Any] | None:
    return None if value is None else value.descriptor()


#: message type -> its fields after the head, in wire order (looked up by the exact type:
#: encode runs for every message a peer sends; a kind with none has no entry)
_FIELDS: dict[type, Callable[[Any], tuple]] = {
    Store: lambda m: (id_to_bytes(m.key), m.value.descriptor(), float(m.ttl_s), m.clock,
                      id_to_bytes(m.writer), m.base),
    Stored: lambda m: (m.clock, id_to_bytes(m.writer), int(m.refused)),
    FindNode: lambda m: (id_to_bytes(m.target),),
    FindValue: lambda m: (id_to_bytes(m.key),),
    Value: lambda m: (id_to_bytes(m.key), m.value.descriptor(), m.clock,
                      id_to_bytes(m.writer)),
    Nodes: lambda m: ([(id_to_bytes(c.node_id), c.address) for c in m.contacts],),
    Call: lambda m: (int(m.method), id_to_bytes(m.key), _plain_args(m.args),
                     _descriptor(m.value)),
    Reply: lambda m: (int(m.status), _plain_args(m.args), _descriptor(m.value),
                      [[id_to_bytes(i), n] for i, n in m.peer_steps]),
}


def _plain_args(args: tuple[Any, ...]) -> list[Any]:
    """Args as the decoder accepts them: int subclasses (enums) become plain ints."""
    return [int(a) if type(a) is not int and isinstance(a, int) and type(a) is not bool
            else a for a in args]


def value_frames(msg: Message) -> tuple[memoryview, ...]:
    """The buffers to send after ``encode(msg)``'s frame: the value's bytes, or nothing."""
    value = getattr(msg, "value", None)
    return () if value is None else (value.data,)


def _int(value: object, what: str, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:  # type: ignore[operator]
        raise ProtocolError(f"{what} must be an int in [{lo}, {hi}], got {brief(value)}")
    return value  # type: ignore[return-value]


def check_id(value: object) -> KadId:
    """A node id or key id as a driver sends it: an int in the id space."""
    return KadId(_int(value, "an id", 0, ID_SPACE - 1))


def check_pair(value: object, what: str) -> tuple[Any, Any]:
    """``value`` as a pair (a tuple or list of two); else ``ProtocolError(what, ...)``."""
    if type(value) not in (tuple, list) or len(value) != 2:  # type: ignore[arg-type]
        raise ProtocolError(f"{what}, got {brief(value)}")
    return value[0], value[1]  # type: ignore[index]


def check_contact(value: object) -> Contact:
    """A contact as a driver sends it: ``(int id, overlay address)``."""
    node_id, address = check_pair(value, "a contact is (node id, address)")
    return Contact(check_id(node_id), _address(address))


def check_name(value: object) -> str:
    """A key's name as a driver sends it."""
    if type(value) is not str:
        raise ProtocolError(f"a key's name is a str, got {brief(value)}")
    return value  # type: ignore[return-value]


def _address(value: object) -> str:
    if type(value) is not str or not 0 < len(value) <= MAX_ADDRESS_CHARS:  # type: ignore[arg-type]
        raise ProtocolError(f"address must be a non-empty str of <= {MAX_ADDRESS_CHARS} chars")
    return value  # type: ignore[return-value]


def _ttl(value: object) -> float:
    # Compare before converting: float() and math.isfinite overflow on ints past 1e308.
    if type(value) not in (int, float) or not 0 < value <= MAX_TTL_S:  # type: ignore[operator]
        raise ProtocolError(f"ttl_s must be a number in (0, {MAX_TTL_S:g}], got {brief(value)}")
    return float(value)  # type: ignore[arg-type]


def _contacts(value: object, max_contacts: int) -> tuple[Contact, ...]:
    if type(value) not in (list, tuple):
        raise ProtocolError(f"contacts must be a list, got {brief(value)}")
    assert isinstance(value, (list, tuple))
    if len(value) > max_contacts:
        raise ProtocolError(f"{len(value)} contacts, over the limit of {max_contacts}")
    out: list[Contact] = []
    seen: set[int] = set()
    for item in value:
        if type(item) not in (list, tuple) or len(item) != 2:
            raise ProtocolError("each contact must be an (id, address) pair")
        node_id = id_from_bytes(item[0])
        if node_id in seen:
            raise ProtocolError("duplicate contact in NODES")
        seen.add(node_id)
        out.append(Contact(node_id, _address(item[1])))
    return tuple(out)


def _args(value: object) -> tuple[Any, ...]:
    if type(value) not in (list, tuple) or len(value) > MAX_ARGS:  # type: ignore[arg-type]
        raise ProtocolError(f"args must be a list of at most {MAX_ARGS} values")
    assert isinstance(value, (list, tuple))
    for item in value:
        kind = type(item)
        if kind is int and not -(1 << 63) <= item < (1 << 63):
            raise ProtocolError(f"arg {brief(item)} is out of the 64-bit range")
        if kind is float and not math.isfinite(item):
            raise ProtocolError("float args must be finite")
        if kind in (str, bytes) and len(item) > MAX_ARG_CHARS:
            raise ProtocolError(f"str/bytes args hold at most {MAX_ARG_CHARS} characters")
        if kind not in (int, float, str, bytes, type(None)):
            raise ProtocolError(f"args are ints, floats, str, bytes or None, not {brief(item)}")
    return tuple(value)


def _peer_steps(value: object) -> tuple[tuple[KadId, int], ...]:
    if type(value) not in (list, tuple) or len(value) > MAX_PEER_STEPS:  # type: ignore[arg-type]
        raise ProtocolError(f"peer_steps must be a list of at most {MAX_PEER_STEPS} pairs")
    assert isinstance(value, (list, tuple))
    out = []
    for item in value:
        if type(item) not in (list, tuple) or len(item) != 2:
            raise ProtocolError("each peer step must be an (id, step) pair")
        out.append((id_from_bytes(item[0]), _int(item[1], "peer step", 0, MAX_STEP)))
    return tuple(out)


class _Frames:
    """The value frames of one message, each used once."""

    def __init__(self, frames: Sequence[object], max_bytes: int) -> None:
        self._frames = list(frames)
        self._used = 0
        self._max = max_bytes

    def value(self, descriptor: object, optional: bool = False) -> Blob | None:
        if descriptor is None and optional:
            return None
        if self._used >= len(self._frames):
            raise ProtocolError("a value descriptor without its frame")
        frame = self._frames[self._used]
        self._used += 1
        return parse(descriptor, frame, self._max)

    def check_all_used(self) -> None:
        if self._used != len(self._frames):
            raise ProtocolError(f"{len(self._frames) - self._used} value frames too many")


def _blob(values: _Frames, descriptor: object) -> Blob:
    found = values.value(descriptor)
    assert found is not None
    return found


def _clock(value: object) -> int:
    return _int(value, "clock", 0, MAX_STEP)


#: kind -> message, from (rpc_id, sender, step, fields, value frames, max_contacts); built
#: once here, not per message (decode runs for every message a peer receives)
_Build = Callable[[int, KadId, int, Sequence[object], _Frames, int], Message]
_BUILD: dict[Kind, _Build] = {
    Kind.PING: lambda r, s, t, f, v, m: Ping(r, s, t),
    Kind.PONG: lambda r, s, t, f, v, m: Pong(r, s, t),
    Kind.LEAVE: lambda r, s, t, f, v, m: Leave(r, s, t),
    Kind.STEP: lambda r, s, t, f, v, m: Step(r, s, t),
    Kind.STORED: lambda r, s, t, f, v, m: Stored(r, s, _clock(f[0]), id_from_bytes(f[1]), t,
                                                 bool(_int(f[2], "refused", 0, 1))),
    Kind.FIND_NODE: lambda r, s, t, f, v, m: FindNode(r, s, id_from_bytes(f[0]), t),
    Kind.FIND_VALUE: lambda r, s, t, f, v, m: FindValue(r, s, id_from_bytes(f[0]), t),
    Kind.NODES: lambda r, s, t, f, v, m: Nodes(r, s, _contacts(f[0], m), t),
    Kind.VALUE: lambda r, s, t, f, v, m: Value(r, s, id_from_bytes(f[0]), _blob(v, f[1]),
                                               _clock(f[2]), id_from_bytes(f[3]), t),
    Kind.STORE: lambda r, s, t, f, v, m: Store(r, s, id_from_bytes(f[0]), _blob(v, f[1]),
                                               _ttl(f[2]), _clock(f[3]), id_from_bytes(f[4]),
                                               t, _int(f[5], "base", -1, MAX_STEP)),
    Kind.CALL: lambda r, s, t, f, v, m: Call(r, s, _int(f[0], "method", 0, 1 << 16),
                                             id_from_bytes(f[1]), _args(f[2]),
                                             v.value(f[3], optional=True), t),
    Kind.REPLY: lambda r, s, t, f, v, m: Reply(r, s, _int(f[0], "status", 0, 1 << 16),
                                               _args(f[1]), v.value(f[2], optional=True), t,
                                               _peer_steps(f[3])),
}
_KINDS = {int(kind): kind for kind in Kind}


_ARITY = {Kind.PING: 0, Kind.PONG: 0, Kind.LEAVE: 0, Kind.STEP: 0, Kind.STORED: 3,
          Kind.FIND_NODE: 1, Kind.FIND_VALUE: 1, Kind.NODES: 1, Kind.VALUE: 4, Kind.STORE: 6,
          Kind.CALL: 4, Kind.REPLY: 4}


def decode(wire: object, frames: Sequence[object] = (), *, max_contacts: int = MAX_CONTACTS,
           max_value_bytes: int = MAX_VALUE_BYTES) -> Message:
    """Parse and validate a plain-values message and the value frames that came with it.

    Args:
        wire: what ``encode`` produced, as received from a peer (anything at all).
        frames: the buffers received after it (``value_frames`` on the sender's side).
        max_contacts: the most contacts a NODES reply may carry (a node passes its ksize).
        max_value_bytes: the largest value accepted.

    Raises:
        ProtocolError: wrong version, unknown kind, wrong arity, types, id length, sizes, or
            value frames that do not match the descriptors.

    >>> decode((5, 99, 0, bytes(20), -1))
    Traceback (most recent call last):
    ...
    actorpy.errors.ProtocolError: unknown message kind 99
    """
    if type(wire) not in (tuple, list) or len(wire) < 5:  # type: ignore[arg-type]
        raise ProtocolError("message must be a tuple (version, kind, rpc_id, sender_id, step, "
                            f"...), got {brief(wire)}")
    assert isinstance(wire, (tuple, list))
    if type(wire[0]) is not int or wire[0] != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {brief(wire[0])}")
    if type(wire[1]) is not int or wire[1] not in _ARITY:
        raise ProtocolError(f"unknown message kind {brief(wire[1])}")
    kind = _KINDS[wire[1]]
    if len(wire) != 5 + _ARITY[kind]:
        raise ProtocolError(f"{kind.name} takes {_ARITY[kind]} fields, got {len(wire) - 5}")
    if type(frames) not in (tuple, list):
        raise ProtocolError("value frames must come as a sequence")
    rpc_id = _int(wire[2], "rpc_id", 0, MAX_RPC_ID)
    sender = id_from_bytes(wire[3])
    step = _int(wire[4], "step", NO_STEP, MAX_STEP)
    f = wire[5:]
    values = _Frames(frames, max_value_bytes)
    message = _BUILD[kind](rpc_id, sender, step, f, values, max_contacts)
    values.check_all_used()
    return message

"""The overlay's messages: typed dataclasses, their kinds, and a strict plain-values codec.

Every message becomes a tuple of ints, bytes, str, floats and lists (``encode``) and comes back
through ``decode``, which checks the version, kind, types, id lengths and sizes and raises
``ProtocolError`` on anything off. The core's wire can carry these tuples as its payload later
without the protocol code changing. Paper section 2.3 names the four RPCs.

>>> msg = FindNode(rpc_id=7, sender_id=KadId(1), target=KadId(2))
>>> decode(encode(msg)) == msg
True
>>> encode(msg)[:3]
(1, 5, 7)
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Callable, ClassVar, Union

from actorpy.errors import ProtocolError

from .ids import KadId, id_from_bytes, id_to_bytes
from .routing import Contact

PROTOCOL_VERSION = 1
MAX_CONTACTS = 64            # a NODES reply holds at most this many (nodes also cap at ksize)
MAX_VALUE_BYTES = 1 << 20    # big tensors travel on the core's data frames, not in STORE
MAX_ADDRESS_CHARS = 256
MAX_RPC_ID = (1 << 64) - 1
MAX_TTL_S = 1e9              # ~31 years; nodes cap it at their own ttl_s anyway


class Kind(IntEnum):
    """Message kinds of the Kademlia overlay (owned by this package, STYLE 2.8)."""

    PING = 1
    PONG = 2
    STORE = 3
    STORED = 4
    FIND_NODE = 5
    NODES = 6
    FIND_VALUE = 7
    VALUE = 8


@dataclass(frozen=True)
class Ping:
    """Are you alive?"""

    KIND: ClassVar[Kind] = Kind.PING
    rpc_id: int
    sender_id: KadId


@dataclass(frozen=True)
class Pong:
    """I am alive."""

    KIND: ClassVar[Kind] = Kind.PONG
    rpc_id: int
    sender_id: KadId


@dataclass(frozen=True)
class Store:
    """Keep ``value`` under ``key`` for ``ttl_s`` more seconds."""

    KIND: ClassVar[Kind] = Kind.STORE
    rpc_id: int
    sender_id: KadId
    key: KadId
    value: bytes
    ttl_s: float


@dataclass(frozen=True)
class Stored:
    """The STORE was applied."""

    KIND: ClassVar[Kind] = Kind.STORED
    rpc_id: int
    sender_id: KadId


@dataclass(frozen=True)
class FindNode:
    """Send me the k contacts you know closest to ``target``."""

    KIND: ClassVar[Kind] = Kind.FIND_NODE
    rpc_id: int
    sender_id: KadId
    target: KadId


@dataclass(frozen=True)
class Nodes:
    """Reply to FIND_NODE (or to FIND_VALUE when the value is not here)."""

    KIND: ClassVar[Kind] = Kind.NODES
    rpc_id: int
    sender_id: KadId
    contacts: tuple[Contact, ...]


@dataclass(frozen=True)
class FindValue:
    """Send me the value stored under ``key``, or else your k closest contacts to it."""

    KIND: ClassVar[Kind] = Kind.FIND_VALUE
    rpc_id: int
    sender_id: KadId
    key: KadId


@dataclass(frozen=True)
class Value:
    """Reply to FIND_VALUE when the value is here."""

    KIND: ClassVar[Kind] = Kind.VALUE
    rpc_id: int
    sender_id: KadId
    key: KadId
    value: bytes


Message = Union[Ping, Pong, Store, Stored, FindNode, Nodes, FindValue, Value]
Request = Union[Ping, Store, FindNode, FindValue]
#: The message classes (what ``receive`` accepts besides wire tuples).
MESSAGE_TYPES = frozenset({Ping, Pong, Store, Stored, FindNode, Nodes, FindValue, Value})
REQUEST_KINDS = frozenset({Kind.PING, Kind.STORE, Kind.FIND_NODE, Kind.FIND_VALUE})
#: Which reply kinds answer which request kind.
REPLY_KINDS: dict[Kind, frozenset[Kind]] = {
    Kind.PING: frozenset({Kind.PONG}),
    Kind.STORE: frozenset({Kind.STORED}),
    Kind.FIND_NODE: frozenset({Kind.NODES}),
    Kind.FIND_VALUE: frozenset({Kind.NODES, Kind.VALUE}),
}

WireMessage = tuple  # (version, kind, rpc_id, sender_id_bytes, *fields)


def encode(msg: Message) -> WireMessage:
    """Plain-values form of a message (see the module docstring)."""
    head = (PROTOCOL_VERSION, int(msg.KIND), msg.rpc_id, id_to_bytes(msg.sender_id))
    if isinstance(msg, Store):
        return head + (id_to_bytes(msg.key), msg.value, float(msg.ttl_s))
    if isinstance(msg, (FindNode,)):
        return head + (id_to_bytes(msg.target),)
    if isinstance(msg, FindValue):
        return head + (id_to_bytes(msg.key),)
    if isinstance(msg, Value):
        return head + (id_to_bytes(msg.key), msg.value)
    if isinstance(msg, Nodes):
        return head + ([(id_to_bytes(c.node_id), c.address) for c in msg.contacts],)
    return head


def brief(value: object, limit: int = 40) -> str:
    """A short description of a received value for error messages; never raises.

    A hostile peer chooses what we describe: ``repr`` of an int of more than 4 300 digits
    raises ``ValueError``, of a deeply nested list ``RecursionError``, and of a huge list it
    costs time, so only plain scalars are shown and containers by type and length.

    >>> brief(10 ** 5000), brief([[[]]]), brief(b"x" * 100, 8)
    ('an int of 16610 bits', 'list of length 1', "b'xxxxxx")
    """
    kind = type(value)
    if kind is int and value.bit_length() > 64:  # type: ignore[attr-defined]
        return f"an int of {value.bit_length()} bits"  # type: ignore[attr-defined]
    if kind in (int, float, bool, type(None)):
        return repr(value)[:limit]
    if kind in (bytes, str):
        return repr(value[:limit])[:limit]  # type: ignore[index]
    if kind in (list, tuple, dict, set, frozenset, bytearray):
        return f"{kind.__name__} of length {len(value)}"  # type: ignore[arg-type]
    return f"a {kind.__name__}"


def _int(value: object, what: str, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise ProtocolError(f"{what} must be an int in [{lo}, {hi}], got {brief(value)}")
    return value


def _bytes(value: object, what: str, max_len: int) -> bytes:
    if type(value) is not bytes:
        raise ProtocolError(f"{what} must be bytes, got {type(value).__name__}")
    if len(value) > max_len:
        raise ProtocolError(f"{what} is {len(value)} bytes, over the limit of {max_len}")
    return value


def _address(value: object) -> str:
    if type(value) is not str or not 0 < len(value) <= MAX_ADDRESS_CHARS:
        raise ProtocolError(f"address must be a non-empty str of <= {MAX_ADDRESS_CHARS} chars")
    return value


def _ttl(value: object) -> float:
    # Compare before converting: float() and math.isfinite overflow on ints past 1e308.
    if type(value) not in (int, float) or not 0 < value <= MAX_TTL_S:  # type: ignore[operator]
        raise ProtocolError(f"ttl_s must be a number in (0, {MAX_TTL_S:g}], got {brief(value)}")
    return float(value)  # type: ignore[arg-type]


def _contacts(value: object, max_contacts: int) -> tuple[Contact, ...]:
    if type(value) not in (list, tuple):
        raise ProtocolError(f"contacts must be a list, got {brief(value)}")
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


_ARITY = {Kind.PING: 0, Kind.PONG: 0, Kind.STORED: 0, Kind.FIND_NODE: 1, Kind.FIND_VALUE: 1,
          Kind.NODES: 1, Kind.VALUE: 2, Kind.STORE: 3}


def decode(wire: object, *, max_contacts: int = MAX_CONTACTS,
           max_value_bytes: int = MAX_VALUE_BYTES) -> Message:
    """Parse and validate a plain-values message.

    Args:
        wire: what ``encode`` produced, as received from a peer (anything at all).
        max_contacts: the most contacts a NODES reply may carry (a node passes its ksize).
        max_value_bytes: the largest value accepted in STORE or VALUE.

    Raises:
        ProtocolError: wrong version, unknown kind, wrong arity, types, id length or sizes.

    >>> decode((1, 99, 0, bytes(20)))
    Traceback (most recent call last):
    ...
    actorpy.errors.ProtocolError: unknown message kind 99
    """
    if type(wire) not in (tuple, list) or len(wire) < 4:  # type: ignore[arg-type]
        raise ProtocolError("message must be a tuple (version, kind, rpc_id, sender_id, ...), "
                            f"got {brief(wire)}")
    assert isinstance(wire, (tuple, list))
    if type(wire[0]) is not int or wire[0] != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {brief(wire[0])}")
    if type(wire[1]) is not int or wire[1] not in _ARITY:
        raise ProtocolError(f"unknown message kind {brief(wire[1])}")
    kind = Kind(wire[1])
    if len(wire) != 4 + _ARITY[kind]:
        raise ProtocolError(f"{kind.name} takes {_ARITY[kind]} fields, got {len(wire) - 4}")
    rpc_id = _int(wire[2], "rpc_id", 0, MAX_RPC_ID)
    sender = id_from_bytes(wire[3])
    f = wire[4:]
    builders: dict[Kind, Callable[[], Message]] = {
        Kind.PING: lambda: Ping(rpc_id, sender),
        Kind.PONG: lambda: Pong(rpc_id, sender),
        Kind.STORED: lambda: Stored(rpc_id, sender),
        Kind.FIND_NODE: lambda: FindNode(rpc_id, sender, id_from_bytes(f[0])),
        Kind.FIND_VALUE: lambda: FindValue(rpc_id, sender, id_from_bytes(f[0])),
        Kind.NODES: lambda: Nodes(rpc_id, sender, _contacts(f[0], max_contacts)),
        Kind.VALUE: lambda: Value(rpc_id, sender, id_from_bytes(f[0]),
                                  _bytes(f[1], "value", max_value_bytes)),
        Kind.STORE: lambda: Store(rpc_id, sender, id_from_bytes(f[0]),
                                  _bytes(f[1], "value", max_value_bytes), _ttl(f[2])),
    }
    return builders[kind]()

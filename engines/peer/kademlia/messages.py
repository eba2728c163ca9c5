"""The overlay's messages: one frozen dataclass per kind (paper section 2.3 names the four RPCs).

Every message carries its sender's ``step`` (-1 outside a job): the barrier reads peers'
progress from messages they exchange anyway (``steps.py``). Stored values carry a version
``(clock, writer)``; holders keep the highest. CALL / REPLY are the engine's own
request/reply pair on top (``method`` and ``status`` are the caller's enums), so its requests
get the node's rpc ids, timeouts, retries and liveness accounting for free.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar, Union

from .ids import KadId
from .routing import Contact
from .values import Blob

NO_STEP = -1


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
    LEAVE = 9
    CALL = 10
    REPLY = 11
    STEP = 12


def _blob(msg: Any) -> None:
    if not isinstance(msg.value, Blob):
        object.__setattr__(msg, "value", Blob.of(msg.value))


@dataclass(frozen=True)
class Ping:
    """Are you alive?"""

    KIND: ClassVar[Kind] = Kind.PING
    rpc_id: int
    sender_id: KadId
    step: int = NO_STEP


@dataclass(frozen=True)
class Pong:
    """I am alive."""

    KIND: ClassVar[Kind] = Kind.PONG
    rpc_id: int
    sender_id: KadId
    step: int = NO_STEP


@dataclass(frozen=True)
class Store:
    """Keep ``value`` (version ``(clock, writer)``) under ``key`` for ``ttl_s`` more seconds,
    unless a higher version is held already. ``base`` (-1: none): the clock of the copy the
    writer's branch grew from (its writes since are its own); an engine's holder may refuse
    a write whose branch lacks the copy it holds (``accept_store``)."""

    KIND: ClassVar[Kind] = Kind.STORE
    rpc_id: int
    sender_id: KadId
    key: KadId
    value: Blob
    ttl_s: float
    clock: int = 0
    writer: KadId = KadId(0)
    step: int = NO_STEP
    base: int = -1

    def __post_init__(self) -> None:
        _blob(self)


@dataclass(frozen=True)
class Stored:
    """The STORE was handled; ``(clock, writer)`` is the version now held, and ``refused``
    whether the write was refused (the fence: ``(clock, writer)`` alone could not tell, as
    an owner that dropped a branch writes its clocks again)."""

    KIND: ClassVar[Kind] = Kind.STORED
    rpc_id: int
    sender_id: KadId
    clock: int = 0
    writer: KadId = KadId(0)
    step: int = NO_STEP
    refused: bool = False


@dataclass(frozen=True)
class FindNode:
    """Send me the k contacts you know closest to ``target``."""

    KIND: ClassVar[Kind] = Kind.FIND_NODE
    rpc_id: int
    sender_id: KadId
    target: KadId
    step: int = NO_STEP


@dataclass(frozen=True)
class Nodes:
    """Reply to FIND_NODE (or to FIND_VALUE when the value is not here)."""

    KIND: ClassVar[Kind] = Kind.NODES
    rpc_id: int
    sender_id: KadId
    contacts: tuple[Contact, ...]
    step: int = NO_STEP


@dataclass(frozen=True)
class FindValue:
    """Send me the value stored under ``key``, or else your k closest contacts to it."""

    KIND: ClassVar[Kind] = Kind.FIND_VALUE
    rpc_id: int
    sender_id: KadId
    key: KadId
    step: int = NO_STEP


@dataclass(frozen=True)
class Value:
    """Reply to FIND_VALUE when the value is here, with its version."""

    KIND: ClassVar[Kind] = Kind.VALUE
    rpc_id: int
    sender_id: KadId
    key: KadId
    value: Blob
    clock: int = 0
    writer: KadId = KadId(0)
    step: int = NO_STEP

    def __post_init__(self) -> None:
        _blob(self)


@dataclass(frozen=True)
class Leave:
    """I am leaving the overlay (my keys were handed on): drop me now. Not answered."""

    KIND: ClassVar[Kind] = Kind.LEAVE
    rpc_id: int
    sender_id: KadId
    step: int = NO_STEP


@dataclass(frozen=True)
class Step:
    """My step is now ``step`` (to a peer that asked for it while ahead of us: it may be
    waiting on us). Not answered: a PING would cost a PONG for nothing."""

    KIND: ClassVar[Kind] = Kind.STEP
    rpc_id: int
    sender_id: KadId
    step: int = NO_STEP


@dataclass(frozen=True)
class Call:
    """An engine request: ``method`` (the engine's enum) about ``key``, with a few plain
    ``args`` (ints, floats, str, bytes, None) and optionally a value."""

    KIND: ClassVar[Kind] = Kind.CALL
    rpc_id: int
    sender_id: KadId
    method: int
    key: KadId
    args: tuple[Any, ...] = ()
    value: Blob | None = None
    step: int = NO_STEP

    def __post_init__(self) -> None:
        if self.value is not None:
            _blob(self)


@dataclass(frozen=True)
class Reply:
    """The answer to a CALL: ``status`` (the engine's enum), ``args``, optionally a value, and
    the freshest steps the answering peer heard first-hand (gossip: a peer that many others
    call, like a key's owner, spreads their progress at no extra message)."""

    KIND: ClassVar[Kind] = Kind.REPLY
    rpc_id: int
    sender_id: KadId
    status: int
    args: tuple[Any, ...] = ()
    value: Blob | None = None
    step: int = NO_STEP
    peer_steps: tuple[tuple[KadId, int], ...] = ()   # steps the answering peer heard lately

    def __post_init__(self) -> None:
        if self.value is not None:
            _blob(self)


Message = Union[Ping, Pong, Store, Stored, FindNode, Nodes, FindValue, Value, Leave, Step, Call,
                Reply]
#: The message classes (what ``receive`` accepts besides wire tuples).
MESSAGE_TYPES = frozenset({Ping, Pong, Store, Stored, FindNode, Nodes, FindValue, Value, Leave,
                           Step, Call, Reply})
REQUEST_KINDS = frozenset({Kind.PING, Kind.STORE, Kind.FIND_NODE, Kind.FIND_VALUE, Kind.CALL})
#: Which reply kinds answer which request kind.
REPLY_KINDS: dict[Kind, frozenset[Kind]] = {
    Kind.PING: frozenset({Kind.PONG}),
    Kind.STORE: frozenset({Kind.STORED}),
    Kind.FIND_NODE: frozenset({Kind.NODES}),
    Kind.FIND_VALUE: frozenset({Kind.NODES, Kind.VALUE}),
    Kind.CALL: frozenset({Kind.REPLY}),
}

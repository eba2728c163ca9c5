"""What a node is configured with and what it hands back to its shell.

A ``KademliaNode`` never sends or sleeps: each call returns ``Effects`` — messages to send
(``Send``), timers to set (``SetTimer``; the shell calls ``node.on_timer(kind, token, now)``
when one is due) and finished operations (``Done``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from .ids import KadId
from .routing import Contact
from .rpc import MAX_VALUE_BYTES, Message


@dataclass(frozen=True)
class KademliaConfig:
    """Knobs, with the paper's names where it has them (section 2.3, 2.5).

    Attributes:
        ksize: bucket size and lookup width *k*.
        alpha: lookup concurrency (requests in flight per lookup).
        replication: how many of the closest nodes store a value (default: ``ksize``).
        rpc_timeout_s: how long to wait for a reply before the contact counts as failed.
        max_failures: consecutive unanswered RPCs after which a contact is dropped from the
            table and skipped for ``dead_for_s``. After a miss short of that, the contact is
            PINGed and not handed out until it answers, so one lost message costs nothing.
        dead_for_s: how long a dropped contact is skipped when other nodes return it.
        refresh_interval_s: a bucket with no lookup in this long gets a random-id lookup.
        republish_interval_s: how often stored keys are re-sent to the current k closest.
        ttl_s: lifetime of a value unless its origin republishes it.
        refresh_on_join: after the self-lookup, refresh buckets beyond the closest neighbour.
        max_value_bytes: the largest value accepted in STORE / VALUE.
        sample_cache_s: how long a subtree's membership found for peer sampling is reused
            (0: never); dead peers leave it at once, live newcomers join it when heard from.
    """

    ksize: int = 20
    alpha: int = 3
    replication: int | None = None
    rpc_timeout_s: float = 2.0
    max_failures: int = 2
    dead_for_s: float = 300.0
    refresh_interval_s: float = 3600.0
    republish_interval_s: float = 3600.0
    ttl_s: float = 86400.0
    refresh_on_join: bool = True
    max_value_bytes: int = MAX_VALUE_BYTES
    sample_cache_s: float = 60.0

    @property
    def copies(self) -> int:
        """The replication factor in effect."""
        return self.ksize if self.replication is None else self.replication


class TimerKind(IntEnum):
    """Timers a node asks its shell for."""

    RPC_TIMEOUT = 1   # token: the rpc id
    REFRESH = 2       # periodic bucket refresh
    REPUBLISH = 3     # periodic expiry sweep + republish


class OpKind(IntEnum):
    """Operations a node runs; the first six are started by its user."""

    FIND_NODE = 1
    FIND_VALUE = 2
    STORE = 3
    JOIN = 4
    SAMPLE = 5
    MEMBERS = 6
    REFRESH = 7
    REPUBLISH = 8
    SUBTREE = 9


@dataclass(frozen=True)
class Send:
    """Send ``message`` to ``address`` (``rpc.encode`` gives its wire form)."""

    address: str
    message: Message


@dataclass(frozen=True)
class SetTimer:
    """Call ``node.on_timer(kind, token, now)`` ``delay_s`` seconds from now."""

    delay_s: float
    kind: TimerKind
    token: int = 0


@dataclass(frozen=True)
class Done:
    """A finished user operation.

    Attributes:
        op_id: what the starting call returned.
        kind: FIND_NODE, FIND_VALUE, STORE, JOIN, SAMPLE or MEMBERS.
        target: the id looked up (the key for FIND_VALUE / STORE).
        contacts: the closest contacts that answered (SAMPLE: the sampled peers; MEMBERS:
            every peer found).
        value: FIND_VALUE's value, or None when not found.
        stored_on: STORE: the contacts that acknowledged (plus this node if it stores a copy).
        rounds: lookup rounds (hops); rpcs: requests sent; elapsed_s: time on the node's clock.
    """

    op_id: int
    kind: OpKind
    target: KadId
    contacts: tuple[Contact, ...] = ()
    value: bytes | None = None
    stored_on: tuple[Contact, ...] = ()
    rounds: int = 0
    rpcs: int = 0
    elapsed_s: float = 0.0


@dataclass
class Effects:
    """Everything one call on a node asks its shell to do."""

    sends: list[Send] = field(default_factory=list)
    timers: list[SetTimer] = field(default_factory=list)
    done: list[Done] = field(default_factory=list)

    def extend(self, other: Effects) -> Effects:
        """Append ``other``'s effects to these; returns self."""
        self.sends.extend(other.sends)
        self.timers.extend(other.timers)
        self.done.extend(other.done)
        return self

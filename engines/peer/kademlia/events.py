"""What a node is configured with and what it hands back to its shell.

A ``KademliaNode`` never sends or sleeps: each call returns ``Effects`` — messages to send
(``Send``), timers to set (``SetTimer``; the shell calls ``node.on_timer(kind, token, now)``
when one is due) and finished operations (``Done``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from .ids import KadId
from .messages import Message, Reply
from .routing import Contact
from .values import Blob

MAX_VALUE_BYTES = 256 << 20


@dataclass(frozen=True)
class KademliaConfig:
    """Knobs, with the paper's names where it has them (section 2.3, 2.5).

    Attributes:
        ksize: bucket size and lookup width *k*.
        alpha: lookup concurrency (requests in flight per lookup).
        replication: how many of the closest nodes store a value (default: ``ksize``).
        rpc_timeout_s: the longest wait for a reply to a PING or FIND_NODE before the
            request counts as missed (the wait before any round trip was measured), and the
            wait for a STORE, FIND_VALUE or CALL, plus its value's allowance (next).
        rpc_timeout_s_per_mb: the allowance per MB (10**6 bytes) that a STORE, FIND_VALUE
            or CALL waits on top of ``rpc_timeout_s``, for the value it carries and the
            value its answer may bring back (the last size seen of that key, or of the copy
            held; a read of a key never seen allows for ``max_value_bytes`` on its retry
            only: ``sizes.py``). The default, 0.02 s (50 MB/s), is well below a loaded
            2-core machine's loopback and a 1 Gb/s link: a 200 MB value waits 4 s more.
            It is a floor: the allowance follows each contact's measured pace (2 x the
            slowest of its last 4 value round trips per MB), and grows after a miss.
            0: the fixed ``rpc_timeout_s``, whatever the size (nothing measured).
        min_rpc_timeout_s: the shortest wait for a PING or FIND_NODE (small requests the
            node answers at once): those time out after ``srtt + 4 * rttvar`` of the
            contact's measured round trips (``rtt.py``; the pooled estimate for one never
            measured), clamped to ``[min_rpc_timeout_s, rpc_timeout_s]`` and doubled per
            timeout until the contact answers again. A reply that comes after its timeout
            (but within ``rpc_timeout_s``) still counts: the contact is alive, and a lookup
            waiting on the retry takes it. Set it to ``rpc_timeout_s`` for fixed timeouts.
            The default leaves room for a loaded 2-core machine that stalls a process for
            tens of milliseconds (loopback round trips are ~0.1-1 ms).
        max_failures: consecutive unanswered RPCs after which a contact is dropped from the
            table and skipped for ``dead_for_s``. After a miss short of that, the contact is
            PINGed and not handed out until it answers, so one lost message costs nothing.
        dead_for_s: how long a dropped contact is skipped when other nodes return it.
        refresh_interval_s: a bucket with no lookup in this long gets a random-id lookup.
        republish_interval_s: how often stored keys are re-sent to the current k closest.
        ttl_s: lifetime of a value unless its origin republishes it.
        refresh_on_join: after the self-lookup, refresh buckets beyond the closest neighbour.
        max_value_bytes: the largest value accepted in STORE / VALUE / CALL / REPLY.
        sample_cache_s: how long a subtree's membership found for peer sampling is reused
            (0: never); dead peers leave it at once, live newcomers join it when heard from.
        holders_cache_s: how long ``set`` reuses the holders its last lookup found for a key
            (an owner writing the same key at every step skips the lookup; 0: always look up);
            a lookup that found no other peer is not kept (the next may find those a table
            lost to false evictions).
        replica_check_s: how often a holder PINGs the other holders of its keys, so a dead
            one is noticed and its keys re-replicated without waiting for the next republish
            (0: only when some request to it fails).
        gossip_steps: how many of the steps it heard most recently a node adds to each REPLY
            it sends (0: none); a peer many others call spreads their progress for free.
        max_in_flight: the most requests a node has out to one contact, CALLs and the rest
            each (``window.py``); more wait in order, their timeouts not started (0: no cap).
    """

    ksize: int = 20
    alpha: int = 3
    replication: int | None = None
    rpc_timeout_s: float = 2.0
    rpc_timeout_s_per_mb: float = 0.02
    min_rpc_timeout_s: float = 0.05
    max_failures: int = 2
    dead_for_s: float = 300.0
    refresh_interval_s: float = 3600.0
    republish_interval_s: float = 3600.0
    ttl_s: float = 86400.0
    refresh_on_join: bool = True
    max_value_bytes: int = MAX_VALUE_BYTES
    sample_cache_s: float = 60.0
    holders_cache_s: float = 0.0
    replica_check_s: float = 0.0
    gossip_steps: int = 16
    max_in_flight: int = 32

    def __post_init__(self) -> None:
        # (one over rpc_timeout_s is cut to it: the timeouts are then fixed)
        if not self.min_rpc_timeout_s > 0:   # 0 or less: every PING and FIND_NODE timed out
            raise ValueError(f"min_rpc_timeout_s must be > 0, not {self.min_rpc_timeout_s}")
        if not 0 <= self.rpc_timeout_s_per_mb < math.inf:   # NaN or inf: never timed out
            raise ValueError("rpc_timeout_s_per_mb must be a finite number >= 0, not "
                             f"{self.rpc_timeout_s_per_mb}")

    @property
    def copies(self) -> int:
        """The replication factor in effect."""
        return self.ksize if self.replication is None else self.replication


class TimerKind(IntEnum):
    """Timers a node asks its shell for."""

    RPC_TIMEOUT = 1   # token: the rpc id
    REFRESH = 2       # periodic bucket refresh
    REPUBLISH = 3     # periodic expiry sweep + republish
    REPLICA_CHECK = 4  # periodic PING of the other holders of our keys


class OpKind(IntEnum):
    """Operations a node runs; the first nine are started by its user (and end in a Done)."""

    FIND_NODE = 1
    FIND_VALUE = 2
    STORE = 3
    JOIN = 4
    SAMPLE = 5
    MEMBERS = 6
    PING = 7
    CALL = 8
    LEAVE = 9
    REFRESH = 10
    REPUBLISH = 11
    SUBTREE = 12
    REPLICATE = 13
    HANDOFF = 14


PUBLIC_OPS = frozenset(OpKind(i) for i in range(1, 10))


@dataclass(frozen=True)
class Send:
    """Send ``message`` to ``address``: ``rpc.encode(message)`` is its frame, followed by the
    frames of ``rpc.value_frames(message)`` (a value's bytes, out of band)."""

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
        kind: which operation (``OpKind``, one of the public ones).
        target: the id looked up (the key for FIND_VALUE / STORE / CALL).
        contacts: FIND_NODE / JOIN: the closest contacts that answered; SAMPLE: the sampled
            peers; MEMBERS: every peer found; PING / CALL: the peer if it answered, else ().
        blob: FIND_VALUE's value (``value`` rebuilds it), or None when not found.
        clock: the version clock of the value found (FIND_VALUE) or written (STORE).
        stored_on: STORE / LEAVE: the contacts that acknowledged (STORE: plus this node if
            it keeps a copy).
        reply: CALL's reply, or None if the peer never answered.
        durable: STORE: every other peer chosen to hold the value answered holding a copy at
            its clock (none timed out, none refused it or held a newer one).
        refusals: STORE: each of them that answered holding another clock, as (peer, that
            clock, the writer of that copy); ``refused`` counts them.
        asked: STORE: how many other peers were asked to hold the value.
        rounds: lookup rounds (hops); rpcs: requests sent; elapsed_s: time on the node's clock.
    """

    op_id: int
    kind: OpKind
    target: KadId
    contacts: tuple[Contact, ...] = ()
    blob: Blob | None = None
    clock: int = 0
    stored_on: tuple[Contact, ...] = ()
    reply: Reply | None = None
    durable: bool = False
    refusals: tuple[tuple[Contact, int, KadId], ...] = ()
    asked: int = 0
    rounds: int = 0
    rpcs: int = 0
    elapsed_s: float = 0.0

    @property
    def refused(self) -> int:
        """STORE: how many holders answered holding another clock."""
        return len(self.refusals)

    @property
    def value(self) -> Any:
        """FIND_VALUE's value rebuilt (bytes, numpy array or tensor), or None."""
        return None if self.blob is None else self.blob.to_value()


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


@dataclass
class NodeStats:
    """Counters a test or benchmark can read (not used by the protocol)."""

    lookups: int = 0
    empty_starts: int = 0          # lookups seeded with nothing although the table was not empty
    max_in_flight: int = 0         # most requests one lookup ever had outstanding
    rpcs_sent: int = 0
    timeouts: int = 0
    late_replies: int = 0          # answers that came after their (adaptive) timeout
    replicated: int = 0            # keys re-replicated after a holder died or left

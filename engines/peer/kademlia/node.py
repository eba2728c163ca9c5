"""One Kademlia node as a sans-I/O state machine: messages and timers in, Effects out.

A shell (the simulator in ``sim.py``, later the P2P engine's runtime) owns the transport and
the clock. It calls ``receive(sender_address, message, now)`` for each arriving message and
``on_timer(kind, token, now)`` for each due timer, then performs the returned ``Effects``.
``sender_address`` must be what the transport authenticated, never a field of the message.

>>> import random
>>> a = KademliaNode(KadId(1), "a", rng=random.Random(0))
>>> b = KademliaNode(KadId(2), "b", rng=random.Random(1))
>>> op, eff = a.join([Contact(KadId(2), "b")], now=0.0)
>>> [(s.address, type(s.message).__name__) for s in eff.sends]
[('b', 'FindNode')]
>>> reply = b.receive("a", eff.sends[0].message, now=0.1).sends[0]
>>> a.receive("b", reply.message, now=0.2).done[0].kind.name
'JOIN'
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Callable, Iterable

from actorpy.errors import ProtocolError

from .events import Done, Effects, KademliaConfig, OpKind, Send, SetTimer, TimerKind
from .ids import KadId, random_id_in_range, shared_prefix_len, short
from .lookup import Lookup
from .routing import Contact, RoutingTable
from .rpc import (MESSAGE_TYPES, REPLY_KINDS, REQUEST_KINDS, FindNode, FindValue, Kind, Message,
                  Nodes, Ping, Pong, Store, Stored, Value, decode)
from .sampling import SampleOp, Sampler, SubtreeCache
from .services import sample_depth, table_size_estimate
from .storage import MemoryStorage, Storage

log = logging.getLogger(__name__)

_PUBLIC = frozenset({OpKind.FIND_NODE, OpKind.FIND_VALUE, OpKind.STORE, OpKind.JOIN})


@dataclass
class _Pending:
    contact: Contact
    kind: Kind
    op_id: int | None
    make: Callable[[int], Message]
    key: int = 0


@dataclass
class _Op:
    op_id: int
    kind: OpKind
    target: KadId
    started_s: float
    lookup: Lookup | None = None
    value: bytes = b""
    ttl_s: float = 0.0
    awaiting: int = 0
    stored_on: list[Contact] = field(default_factory=list)
    in_flight: int = 0
    rpcs: int = 0
    # internal operations end by calling this instead of producing a Done
    then: Callable[[_Op, float, Effects], None] | None = None


@dataclass
class NodeStats:
    """Counters a test or benchmark can read (not used by the protocol)."""

    lookups: int = 0
    empty_starts: int = 0          # lookups seeded with nothing although the table was not empty
    max_in_flight: int = 0         # most requests one lookup ever had outstanding
    rpcs_sent: int = 0
    timeouts: int = 0


class KademliaNode:
    """A Kademlia peer's protocol logic.

    Args:
        node_id: this node's 160-bit id.
        address: how peers reach this node (put in the contacts we hand out by others).
        config: the knobs (``KademliaConfig``).
        rng: injected randomness (rpc ids, refresh targets).
        storage: where values live (default: in memory).
        now: creation time on the shell's clock.
    """

    def __init__(self, node_id: KadId, address: str, config: KademliaConfig | None = None,
                 rng: random.Random | None = None, storage: Storage | None = None,
                 now: float = 0.0) -> None:
        self.config = config or KademliaConfig()
        self.node_id = node_id
        self.address = address
        self.routing = RoutingTable(node_id, self.config.ksize, now)
        self.storage: Storage = storage if storage is not None else MemoryStorage()
        self.stats = NodeStats()
        self._rng = rng if rng is not None else random.Random(node_id)
        self._pending: dict[int, _Pending] = {}
        self._ops: dict[int, _Op] = {}
        self._dead: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._probing: set[int] = set()      # table contacts with a PING in flight
        self._suspects: set[int] = set()     # table contacts that missed a reply: not handed out
        self._next_op = 1
        self.subtrees = SubtreeCache()
        self._sampler = Sampler(node_id, self.config.ksize, self.subtrees,
                                self.config.sample_cache_s, self._subtree_lookup)

    # ------------------------------------------------------------ user calls
    def start(self, now: float) -> Effects:
        """Arm the periodic refresh and republish timers (call once)."""
        return Effects(timers=[SetTimer(self.config.refresh_interval_s, TimerKind.REFRESH),
                               SetTimer(self.config.republish_interval_s, TimerKind.REPUBLISH)])

    def join(self, bootstrap: Iterable[Contact], now: float) -> tuple[int, Effects]:
        """Enter the overlay through known contacts: a lookup of our own id (paper 2.3)."""
        for contact in bootstrap:
            if contact.node_id != self.node_id:
                self.routing.observe(contact, now)
        return self._begin(OpKind.JOIN, self.node_id, now)

    def find_node(self, target: KadId, now: float) -> tuple[int, Effects]:
        """Start a lookup of the k nodes closest to ``target``; ends in a ``Done``."""
        return self._begin(OpKind.FIND_NODE, target, now)

    def get(self, key: KadId, now: float) -> tuple[int, Effects]:
        """Start a FIND_VALUE lookup (answered at once when held here)."""
        value = self.storage.get(key, now)
        if value is not None:
            op_id = self._new_op_id()
            return op_id, Effects(done=[Done(op_id, OpKind.FIND_VALUE, key, value=value)])
        return self._begin(OpKind.FIND_VALUE, key, now)

    def set(self, key: KadId, value: bytes, now: float,
            ttl_s: float | None = None) -> tuple[int, Effects]:
        """Store ``value`` on the ``replication`` nodes closest to ``key``; this node becomes its
        origin and renews it at every republish."""
        if len(value) > self.config.max_value_bytes:
            raise ValueError(f"value of {len(value)} bytes is over max_value_bytes")
        ttl = self.config.ttl_s if ttl_s is None else ttl_s
        self.storage.put(key, value, now, ttl, is_origin=True)
        return self._begin(OpKind.STORE, key, now, value=value, ttl_s=ttl)

    def sample_peers(self, beta: int, rng: random.Random, now: float) -> tuple[int, Effects]:
        """Start drawing ``beta`` distinct other peers uniformly at random without replacement
        (see ``sampling``); the ``Done`` lists them (all of them if the overlay is smaller).
        Once the subtrees are cached (``sample_cache_s``) a sample sends nothing."""
        op_id = self._new_op_id()
        depth = sample_depth(self.size_estimate(), self.config.ksize)
        eff = Effects()
        self._sampler.sample(SampleOp(op_id, beta, depth, rng, now, self._sample_done), now, eff)
        return op_id, eff

    def members(self, rng: random.Random, now: float) -> tuple[int, Effects]:
        """Start enumerating every live peer of the overlay (``Done.contacts``), subtree by
        subtree through the same cache as ``sample_peers`` (BSP/SSP need every peer).

        Raises:
            ValueError: the overlay is too large to enumerate (see ``sampling``).
        """
        op_id = self._new_op_id()
        depth = sample_depth(self.size_estimate(), self.config.ksize)
        eff = Effects()
        self._sampler.enumerate(SampleOp(op_id, None, depth, rng, now, self._sample_done),
                                now, eff)
        return op_id, eff

    def size_estimate(self) -> float:
        """Network size estimated from id density in our routing table (this node counted)."""
        return table_size_estimate(self.routing)

    # ------------------------------------------------------------ shell calls
    def receive(self, sender_address: str, message: object, now: float) -> Effects:
        """Handle one message from ``sender_address`` (a decoded ``Message`` or its wire form).

        Raises:
            ProtocolError: malformed, unsolicited, or claiming an id it does not own; nothing
                was changed. The shell logs it and keeps serving.
        """
        if type(message) not in MESSAGE_TYPES:
            # anything but our own message objects is wire data from a peer: validate it all
            message = decode(message, max_contacts=self.config.ksize,
                             max_value_bytes=self.config.max_value_bytes)
        sender = Contact(message.sender_id, sender_address)
        if sender.node_id == self.node_id:
            raise ProtocolError(f"{sender_address} claims our own id")
        known = self.routing.get(sender.node_id)
        if known is not None and known.address != sender_address:
            raise ProtocolError(f"{sender_address} claims the id of {known.address}")
        holder = self.routing.id_at(sender_address)
        if holder is not None and holder != sender.node_id:
            raise ProtocolError(f"{sender_address} is in the table under another id")
        eff = Effects()
        if message.KIND in REQUEST_KINDS:
            self._note_alive(sender, now, eff)
            eff.sends.append(Send(sender_address, self._answer(message, now)))
            return eff
        pending = self._pending.get(message.rpc_id)
        if pending is None or pending.contact.address != sender_address:
            raise ProtocolError(f"unsolicited {message.KIND.name} from {sender_address}")
        if pending.contact.node_id != sender.node_id:
            raise ProtocolError(f"{sender_address} answered under another id")
        if message.KIND not in REPLY_KINDS[pending.kind]:
            raise ProtocolError(f"{message.KIND.name} does not answer {pending.kind.name}")
        if isinstance(message, Value) and message.key != pending.key:
            raise ProtocolError("VALUE for a key that was not asked for")
        del self._pending[message.rpc_id]
        if pending.kind == Kind.PING:
            self._probing.discard(sender.node_id)
        self._note_alive(sender, now, eff)
        op = self._ops.get(pending.op_id) if pending.op_id is not None else None
        if op is not None:
            op.in_flight -= 1
            self._on_reply(op, sender, message, now, eff)
        return eff

    def on_timer(self, kind: TimerKind, token: int, now: float) -> Effects:
        """A timer set through ``SetTimer`` is due."""
        eff = Effects()
        if kind == TimerKind.RPC_TIMEOUT:
            pending = self._pending.pop(token, None)
            if pending is not None:
                self._on_timeout(pending, now, eff)
        elif kind == TimerKind.REFRESH:
            for bucket in self.routing.stale_buckets(now, self.config.refresh_interval_s):
                target = random_id_in_range(bucket.lo, bucket.hi, self._rng)
                self._begin(OpKind.REFRESH, target, now, eff=eff)
            eff.timers.append(SetTimer(self.config.refresh_interval_s, TimerKind.REFRESH))
        elif kind == TimerKind.REPUBLISH:
            self._republish(now, eff)
            eff.timers.append(SetTimer(self.config.republish_interval_s, TimerKind.REPUBLISH))
        return eff

    # ------------------------------------------------------------ internals
    def _new_op_id(self) -> int:
        self._next_op += 1
        return self._next_op - 1

    def _is_dead(self, node_id: int, now: float) -> bool:
        until = self._dead.get(node_id)
        return until is not None and now < until

    def _note_alive(self, contact: Contact, now: float, eff: Effects) -> None:
        node_id = contact.node_id
        self._dead.pop(node_id, None)
        self._failures.pop(node_id, None)
        self._suspects.discard(node_id)
        if node_id not in self.routing:
            self.subtrees.admit(contact)
        oldest = self.routing.observe(contact, now)
        if oldest is not None:
            # Full bucket: keep the old contact unless it fails its PINGs (paper 2.2).
            self._probe(oldest, now, eff)

    def _probe(self, contact: Contact, now: float, eff: Effects) -> None:
        if contact.node_id not in self._probing:
            self._probing.add(contact.node_id)
            self._request(contact, lambda rpc: Ping(rpc, self.node_id), None, now, eff)

    def _evict(self, node_id: int, now: float) -> None:
        self._dead[node_id] = now + self.config.dead_for_s
        self._failures.pop(node_id, None)
        self._suspects.discard(node_id)
        self.routing.remove(node_id)
        self.subtrees.forget(node_id)

    def _closest(self, target: int, exclude: int | None = None) -> list[Contact]:
        """Our k closest contacts, leaving out suspects (so a contact that missed one reply is
        neither handed to others nor used as a lookup seed until it answers again)."""
        skip = self._suspects if exclude is None else self._suspects | {exclude}
        return self.routing.closest(target, self.config.ksize, exclude=frozenset(skip))

    def _answer(self, message: Message, now: float) -> Message:
        k, me = self.config.ksize, self.node_id
        if isinstance(message, Ping):
            return Pong(message.rpc_id, me)
        if isinstance(message, Store):
            self.storage.put(message.key, message.value, now, min(message.ttl_s, self.config.ttl_s))
            return Stored(message.rpc_id, me)
        if isinstance(message, FindValue):
            value = self.storage.get(message.key, now)
            if value is not None:
                return Value(message.rpc_id, me, message.key, value)
            target = message.key
        else:
            assert isinstance(message, FindNode)
            target = message.target
        return Nodes(message.rpc_id, me, tuple(self._closest(target, message.sender_id)))

    def _request(self, contact: Contact, make: Callable[[int], Message], op: _Op | None,
                 now: float, eff: Effects, key: int = 0) -> None:
        rpc_id = self._rng.getrandbits(63)
        while rpc_id in self._pending:
            rpc_id = self._rng.getrandbits(63)
        message = make(rpc_id)
        self._pending[rpc_id] = _Pending(contact, message.KIND, op.op_id if op else None, make,
                                         key)
        self.stats.rpcs_sent += 1
        if op is not None:
            op.rpcs += 1
            op.in_flight += 1
            if op.lookup is not None and op.awaiting == 0:
                self.stats.max_in_flight = max(self.stats.max_in_flight, op.in_flight)
        eff.sends.append(Send(contact.address, message))
        eff.timers.append(SetTimer(self.config.rpc_timeout_s, TimerKind.RPC_TIMEOUT, rpc_id))

    def _begin(self, kind: OpKind, target: KadId, now: float, eff: Effects | None = None,
               **fields: object) -> tuple[int, Effects]:
        eff = eff if eff is not None else Effects()
        op = _Op(self._new_op_id(), kind, target, now, **fields)  # type: ignore[arg-type]
        seeds = self._closest(target)
        op.lookup = Lookup(target, seeds, ksize=self.config.ksize, alpha=self.config.alpha,
                           own_id=self.node_id)
        self.stats.lookups += 1
        if op.lookup.seeded_empty and len(self.routing):
            self.stats.empty_starts += 1
        self.routing.touch(target, now)
        self._ops[op.op_id] = op
        self._pump(op, now, eff)
        return op.op_id, eff

    def _pump(self, op: _Op, now: float, eff: Effects) -> None:
        lookup = op.lookup
        assert lookup is not None
        if op.kind == OpKind.FIND_VALUE:
            make: Callable[[Contact], Callable[[int], Message]] = (
                lambda c: lambda rpc: FindValue(rpc, self.node_id, op.target))
        else:
            make = lambda c: lambda rpc: FindNode(rpc, self.node_id, op.target)  # noqa: E731
        for contact in lookup.next_queries():
            self._request(contact, make(contact), op, now, eff, key=op.target)
        if lookup.is_done:
            self._lookup_done(op, now, eff)

    def _on_reply(self, op: _Op, sender: Contact, message: Message, now: float,
                  eff: Effects) -> None:
        if isinstance(message, Stored):                  # STORE phase of STORE / REPUBLISH
            op.awaiting -= 1
            op.stored_on.append(sender)
            if op.awaiting == 0:
                self._finish(op, now, eff)
            return
        if op.lookup is None or op.lookup.is_done:
            return
        if isinstance(message, Value):
            op.lookup.on_value(sender.node_id, message.value)
        elif isinstance(message, Nodes):
            dead = self._dead
            fresh = [c for c in message.contacts
                     if c.node_id not in dead or not self._is_dead(c.node_id, now)]
            op.lookup.on_nodes(sender.node_id, fresh)
        self._pump(op, now, eff)

    def _on_timeout(self, pending: _Pending, now: float, eff: Effects) -> None:
        node_id = pending.contact.node_id
        self.stats.timeouts += 1
        failures = self._failures.get(node_id, 0) + 1
        self._failures[node_id] = failures
        if pending.kind == Kind.PING:
            self._probing.discard(node_id)
        log.debug("%s: %s timed out (%s, miss %d)", short(self.node_id),
                  pending.contact.address, pending.kind.name, failures)
        op = self._ops.get(pending.op_id) if pending.op_id is not None else None
        if op is not None:
            op.in_flight -= 1
        if failures < self.config.max_failures:
            # One miss may be one lost message: ask again before giving up on the contact
            # (the paper's LRS PING rule, made tolerant of loss); meanwhile it is not handed
            # out. A running operation keeps waiting for the retry, so loss costs it time, not
            # exactness.
            if node_id in self.routing:
                self._suspects.add(node_id)
            if op is not None:
                self._request(pending.contact, pending.make, op, now, eff, key=pending.key)
            elif node_id in self.routing:
                self._probe(pending.contact, now, eff)
            return
        self._evict(node_id, now)           # consecutive misses: dead (or gone)
        if op is None:
            return
        if pending.kind == Kind.STORE:
            op.awaiting -= 1
            if op.awaiting == 0:
                self._finish(op, now, eff)
        elif op.lookup is not None and not op.lookup.is_done:
            op.lookup.on_failure(node_id)
            self._pump(op, now, eff)

    def _lookup_done(self, op: _Op, now: float, eff: Effects) -> None:
        assert op.lookup is not None
        if op.kind in (OpKind.STORE, OpKind.REPUBLISH):
            me = Contact(self.node_id, self.address)
            holders = sorted(op.lookup.result() + [me], key=lambda c: c.node_id ^ op.target)
            for contact in holders[:self.config.copies]:
                if contact == me:
                    self.storage.put(op.target, op.value, now, op.ttl_s)
                    op.stored_on.append(me)
                else:
                    op.awaiting += 1
                    self._request(contact, lambda rpc: Store(rpc, self.node_id, op.target,
                                                             op.value, op.ttl_s), op, now, eff)
            if op.awaiting == 0:
                self._finish(op, now, eff)
            return
        if op.kind == OpKind.JOIN and self.config.refresh_on_join and op.lookup.result():
            level = shared_prefix_len(self.node_id, op.lookup.result()[0].node_id)
            for bucket in self.routing.buckets:
                if not bucket.covers(self.node_id) and bucket.depth() <= level:
                    target = random_id_in_range(bucket.lo, bucket.hi, self._rng)
                    self._begin(OpKind.REFRESH, target, now, eff=eff)
        self._finish(op, now, eff)

    def _finish(self, op: _Op, now: float, eff: Effects) -> None:
        if self._ops.pop(op.op_id, None) is None:
            return
        if op.then is not None:
            op.then(op, now, eff)
            return
        if op.kind not in _PUBLIC:
            return
        lookup = op.lookup
        eff.done.append(Done(
            op.op_id, op.kind, op.target, tuple(lookup.result()) if lookup is not None else (),
            value=lookup.value if lookup is not None else None,
            stored_on=tuple(op.stored_on), rounds=lookup.rounds if lookup is not None else 0,
            rpcs=op.rpcs, elapsed_s=now - op.started_s))

    def _subtree_lookup(self, target: KadId, now: float, eff: Effects,
                        on_result: Callable[[list[Contact], int, float, Effects], None]) -> None:
        def then(op: _Op, when: float, eff: Effects) -> None:
            assert op.lookup is not None
            on_result(op.lookup.result(), op.rpcs, when, eff)
        self._begin(OpKind.SUBTREE, target, now, eff=eff, then=then)

    def _sample_done(self, op: SampleOp, now: float, eff: Effects) -> None:
        kind = OpKind.SAMPLE if op.beta is not None else OpKind.MEMBERS
        eff.done.append(Done(op.op_id, kind, self.node_id, tuple(op.chosen.values()),
                             rpcs=op.rpcs, elapsed_s=now - op.started_s))

    def _republish(self, now: float, eff: Effects) -> None:
        self.storage.expire(now)
        interval = self.config.republish_interval_s
        for key, record in self.storage.due_for_republish(now, interval):
            ttl = self.config.ttl_s if record.is_origin else record.expires_at - now
            if record.is_origin:
                self.storage.put(key, record.value, now, ttl, is_origin=True)
            self._begin(OpKind.REPUBLISH, key, now, eff=eff, value=record.value, ttl_s=ttl)

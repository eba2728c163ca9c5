"""One Kademlia node as a sans-I/O state machine: messages and timers in, Effects out.

A shell (the simulator in ``sim.py``, later the P2P engine's runtime) owns the transport and
the clock. It calls ``receive(sender_address, message, now, frames)`` for each arriving
message and ``on_timer(kind, token, now)`` for each due timer, then performs the returned
``Effects``. ``sender_address`` must be what the transport authenticated, never a field of the
message. Keeping keys alive (republish, re-replication, hand-off on leave) is in ``upkeep.py``.

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
from typing import Any, Callable, Iterable, Sequence

from actorpy.errors import ProtocolError

from .events import PUBLIC_OPS, Done, Effects, KademliaConfig, OpKind, Send, SetTimer, TimerKind
from .ids import KadId, random_id_in_range, shared_prefix_len, short
from .lookup import Lookup
from .messages import (MESSAGE_TYPES, NO_STEP, REPLY_KINDS, REQUEST_KINDS, Call, FindNode,
                       FindValue, Kind, Leave, Message, Nodes, Ping, Pong, Reply, Store, Stored,
                       Value)
from .routing import Contact, RoutingTable
from .rpc import decode
from .sampling import SampleOp, Sampler, SubtreeCache
from .services import sample_depth, table_size_estimate
from .steps import StepTable
from .storage import MemoryStorage, Storage
from .upkeep import STORE_OPS, Upkeep
from .values import Blob

log = logging.getLogger(__name__)

#: What an engine answers a CALL with: (status, args, value or None).
Answer = tuple[int, tuple[Any, ...], Any]
#: ``on_call(sender, call, now, effects) -> Answer``: runs on the node's thread; it may add
#: effects (e.g. start a ``set``) to the effects it is handed.
CallHandler = Callable[[Contact, Call, float, Effects], Answer]
NO_HANDLER = 0   # the status of a CALL that no engine handles


def _no_handler(sender: Contact, call: Call, now: float, eff: Effects) -> Answer:
    return NO_HANDLER, (), None


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
    value: Blob | None = None           # STORE phase: what to store, and its version
    ttl_s: float = 0.0
    clock: int = 0
    writer: KadId = KadId(0)
    exclude_self: bool = False          # HANDOFF: keep no copy here
    awaiting: int = 0
    stored_on: list[Contact] = field(default_factory=list)
    reply: Reply | None = None
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
    replicated: int = 0            # keys re-replicated after a holder died or left


class KademliaNode:
    """A Kademlia peer's protocol logic.

    Args:
        node_id: this node's 160-bit id.
        address: how peers reach this node (put in the contacts we hand out by others).
        config: the knobs (``KademliaConfig``).
        rng: injected randomness (rpc ids, refresh targets).
        storage: where values live (default: in memory).
        now: creation time on the shell's clock.

    Attributes:
        step: this node's completed steps in its job (-1 outside one), sent with every
            message; the engine sets it.
        steps: the steps other peers reported (``StepTable``).
        on_call: the engine's CALL handler (``CallHandler``).
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
        self.step = NO_STEP
        self.steps = StepTable()
        self.on_call: CallHandler = _no_handler
        self.subtrees = SubtreeCache()
        self.upkeep = Upkeep(self)
        self._rng = rng if rng is not None else random.Random(node_id)
        self._pending: dict[int, _Pending] = {}
        self._ops: dict[int, _Op] = {}
        self._dead: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._probing: set[int] = set()      # table contacts with a PING in flight
        self._suspects: set[int] = set()     # table contacts that missed a reply: not handed out
        self._holders: dict[int, tuple[list[Contact], float]] = {}
        self._next_op = 1
        self._sampler = Sampler(node_id, self.config.ksize, self.subtrees,
                                self.config.sample_cache_s, self._subtree_lookup)

    # ------------------------------------------------------------ user calls
    def start(self, now: float) -> Effects:
        """Arm the periodic timers (call once)."""
        eff = Effects(timers=[SetTimer(self.config.refresh_interval_s, TimerKind.REFRESH),
                              SetTimer(self.config.republish_interval_s, TimerKind.REPUBLISH)])
        if self.config.replica_check_s > 0:
            eff.timers.append(SetTimer(self.config.replica_check_s, TimerKind.REPLICA_CHECK))
        return eff

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
        """Start a FIND_VALUE lookup (answered at once when held here); ``Done.value`` and
        ``Done.clock`` give what was found."""
        record = self.storage.get(key, now)
        if record is not None:
            op_id = self._new_op_id()
            return op_id, Effects(done=[Done(op_id, OpKind.FIND_VALUE, key, blob=record.value,
                                             clock=record.clock)])
        return self._begin(OpKind.FIND_VALUE, key, now)

    def set(self, key: KadId, value: Any, now: float, ttl_s: float | None = None,
            clock: int | None = None) -> tuple[int, Effects]:
        """Store ``value`` (bytes, numpy array or tensor) on the ``replication`` nodes closest
        to ``key``, with version ``(clock, this node)``; this node keeps a copy and renews it
        at every republish. ``clock`` defaults to one past the version held here (0 if none).

        Raises:
            ValueError: the value is over ``max_value_bytes``.
            TypeError: the value is not bytes, a numpy array or a tensor.
        """
        blob = Blob.of(value)
        if blob.nbytes > self.config.max_value_bytes:
            raise ValueError(f"value of {blob.nbytes} bytes is over max_value_bytes")
        ttl = self.config.ttl_s if ttl_s is None else ttl_s
        if clock is None:
            held = self.storage.get(key, now)
            clock = 0 if held is None else held.clock + 1
        self.storage.put(key, blob, now, ttl, is_origin=True, clock=clock, writer=self.node_id)
        fields = dict(value=blob, ttl_s=ttl, clock=clock, writer=self.node_id)
        cached = self._holders.get(key)
        if cached is not None and now < cached[1]:
            op = _Op(self._new_op_id(), OpKind.STORE, key, now, **fields)  # type: ignore[arg-type]
            self._ops[op.op_id] = op
            eff = Effects()
            self._store_phase(op, cached[0], now, eff)
            return op.op_id, eff
        return self._begin(OpKind.STORE, key, now, **fields)

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

    def ping(self, contact: Contact, now: float) -> tuple[int, Effects]:
        """PING one peer (its PONG refreshes its step in ``steps``); ``Done.contacts`` holds it
        if it answered, nothing if it is gone."""
        op = self._single(OpKind.PING, contact.node_id, now)
        eff = Effects()
        self._request(contact, lambda rpc: Ping(rpc, self.node_id, self.step), op, now, eff)
        return op.op_id, eff

    def call(self, contact: Contact, method: int, key: KadId, now: float,
             args: Sequence[Any] = (), value: Any = None) -> tuple[int, Effects]:
        """Send an engine request (``Call``) to ``contact``; ``Done.reply`` is its ``Reply``,
        or None if the peer did not answer (after ``max_failures`` tries)."""
        op = self._single(OpKind.CALL, key, now)
        blob = None if value is None else Blob.of(value)
        eff = Effects()
        self._request(contact, lambda rpc: Call(rpc, self.node_id, method, key, tuple(args),
                                                blob, self.step), op, now, eff)
        return op.op_id, eff

    def leave(self, now: float) -> tuple[int, Effects]:
        """Leave gracefully: hand every key held to its closest other peers, then tell every
        contact (LEAVE) so they drop this node at once. Ends in a Done (``stored_on``: the
        peers that took keys); the shell may stop the node after it."""
        op = self._single(OpKind.LEAVE, self.node_id, now)
        eff = Effects()
        self.upkeep.leave(op, now, eff)
        return op.op_id, eff

    def size_estimate(self) -> float:
        """Network size estimated from id density in our routing table (this node counted)."""
        return table_size_estimate(self.routing)

    # ------------------------------------------------------------ shell calls
    def receive(self, sender_address: str, message: object, now: float,
                frames: Sequence[object] = ()) -> Effects:
        """Handle one message from ``sender_address``: a decoded ``Message``, or its wire form
        (``rpc.encode``) with the value ``frames`` that came after it.

        Raises:
            ProtocolError: malformed, unsolicited, or claiming an id it does not own; nothing
                was changed. The shell logs it and keeps serving.
        """
        if type(message) not in MESSAGE_TYPES:
            # anything but our own message objects is wire data from a peer: validate it all
            message = decode(message, frames, max_contacts=self.config.ksize,
                             max_value_bytes=self.config.max_value_bytes)
        assert isinstance(message, tuple(MESSAGE_TYPES))
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
        if isinstance(message, Leave):
            if known is not None:               # only a peer we hold can take itself out
                log.debug("%s: %s left", short(self.node_id), sender_address)
                self._evict(sender.node_id, now, eff)
            return eff
        if message.KIND in REQUEST_KINDS:
            self._note_alive(sender, message.step, now, eff)
            eff.sends.append(Send(sender_address, self._answer(sender, message, now, eff)))
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
        self._note_alive(sender, message.step, now, eff)
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
            self.upkeep.republish(now, eff)
            eff.timers.append(SetTimer(self.config.republish_interval_s, TimerKind.REPUBLISH))
        elif kind == TimerKind.REPLICA_CHECK:
            self.upkeep.check_replicas(now, eff)
            eff.timers.append(SetTimer(self.config.replica_check_s, TimerKind.REPLICA_CHECK))
        return eff

    # ------------------------------------------------------------ internals
    def _new_op_id(self) -> int:
        self._next_op += 1
        return self._next_op - 1

    def _single(self, kind: OpKind, target: KadId, now: float) -> _Op:
        op = _Op(self._new_op_id(), kind, target, now)
        self._ops[op.op_id] = op
        return op

    def _is_dead(self, node_id: int, now: float) -> bool:
        until = self._dead.get(node_id)
        return until is not None and now < until

    def _note_alive(self, contact: Contact, step: int, now: float, eff: Effects) -> None:
        node_id = contact.node_id
        if step != NO_STEP:
            self.steps.observe(node_id, contact.address, step, now)
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
            self._request(contact, lambda rpc: Ping(rpc, self.node_id, self.step), None, now,
                          eff)

    def _evict(self, node_id: int, now: float, eff: Effects) -> None:
        """``node_id`` is dead or left: forget it everywhere, then re-replicate its keys."""
        self._dead[node_id] = now + self.config.dead_for_s
        self._failures.pop(node_id, None)
        self._suspects.discard(node_id)
        self.routing.remove(node_id)
        self.subtrees.forget(node_id)
        self.steps.forget(node_id)
        for key in [k for k, (held, _) in self._holders.items()
                    if any(c.node_id == node_id for c in held)]:
            del self._holders[key]
        self.upkeep.peer_gone(node_id, now, eff)

    def _closest(self, target: int, exclude: int | None = None) -> list[Contact]:
        """Our k closest contacts, leaving out suspects (so a contact that missed one reply is
        neither handed to others nor used as a lookup seed until it answers again)."""
        skip = self._suspects if exclude is None else self._suspects | {exclude}
        return self.routing.closest(target, self.config.ksize, exclude=frozenset(skip))

    def _answer(self, sender: Contact, message: Message, now: float, eff: Effects) -> Message:
        me, step = self.node_id, self.step
        if isinstance(message, Ping):
            return Pong(message.rpc_id, me, step)
        if isinstance(message, Store):
            self.storage.put(message.key, message.value, now,
                             min(message.ttl_s, self.config.ttl_s), clock=message.clock,
                             writer=message.writer)
            held = self.storage.get(message.key, now)
            clock, writer = (held.clock, held.writer) if held is not None else (0, KadId(0))
            return Stored(message.rpc_id, me, clock, writer, step)
        if isinstance(message, Call):
            status, args, value = self.on_call(sender, message, now, eff)
            return Reply(message.rpc_id, me, status, tuple(args), value, step)
        if isinstance(message, FindValue):
            record = self.storage.get(message.key, now)
            if record is not None:
                return Value(message.rpc_id, me, message.key, record.value, record.clock,
                             record.writer, step)
            target = message.key
        else:
            assert isinstance(message, FindNode)
            target = message.target
        return Nodes(message.rpc_id, me, tuple(self._closest(target, message.sender_id)), step)

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
        me, target = self.node_id, op.target
        for contact in lookup.next_queries():
            if op.kind == OpKind.FIND_VALUE:
                make: Callable[[int], Message] = (
                    lambda rpc: FindValue(rpc, me, target, self.step))
            else:
                make = lambda rpc: FindNode(rpc, me, target, self.step)  # noqa: E731
            self._request(contact, make, op, now, eff, key=target)
        if lookup.is_done:
            self._lookup_done(op, now, eff)

    def _on_reply(self, op: _Op, sender: Contact, message: Message, now: float,
                  eff: Effects) -> None:
        if isinstance(message, Stored):                  # STORE phase
            op.awaiting -= 1
            op.stored_on.append(sender)
            if op.awaiting == 0:
                self._finish(op, now, eff)
            return
        if isinstance(message, (Pong, Reply)):           # PING / CALL
            op.stored_on.append(sender)
            op.reply = message if isinstance(message, Reply) else None
            self._finish(op, now, eff)
            return
        if op.lookup is None or op.lookup.is_done:
            return
        if isinstance(message, Value):
            op.lookup.on_value(sender.node_id, message)
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
        self._evict(node_id, now, eff)      # consecutive misses: dead (or gone)
        if op is None:
            return
        if pending.kind == Kind.STORE:
            op.awaiting -= 1
            if op.awaiting == 0:
                self._finish(op, now, eff)
        elif pending.kind in (Kind.PING, Kind.CALL):
            self._finish(op, now, eff)
        elif op.lookup is not None and not op.lookup.is_done:
            op.lookup.on_failure(node_id)
            self._pump(op, now, eff)

    def _lookup_done(self, op: _Op, now: float, eff: Effects) -> None:
        assert op.lookup is not None
        if op.kind in STORE_OPS:
            found = op.lookup.result()
            if op.kind == OpKind.STORE and self.config.holders_cache_s > 0:
                self._holders[op.target] = (found, now + self.config.holders_cache_s)
            self._store_phase(op, found, now, eff)
            return
        if op.kind == OpKind.JOIN and self.config.refresh_on_join and op.lookup.result():
            level = shared_prefix_len(self.node_id, op.lookup.result()[0].node_id)
            for bucket in self.routing.buckets:
                if not bucket.covers(self.node_id) and bucket.depth() <= level:
                    target = random_id_in_range(bucket.lo, bucket.hi, self._rng)
                    self._begin(OpKind.REFRESH, target, now, eff=eff)
        self._finish(op, now, eff)

    def _store_phase(self, op: _Op, found: Sequence[Contact], now: float, eff: Effects) -> None:
        """STORE ``op.value`` on the ``replication`` closest of ``found`` (and us, unless
        handing off), then finish."""
        me = Contact(self.node_id, self.address)
        candidates = list(found) if op.exclude_self else [*found, me]
        holders = sorted(candidates, key=lambda c: c.node_id ^ op.target)[:self.config.copies]
        value = op.value
        assert value is not None
        for contact in holders:
            if contact == me:
                self.storage.put(op.target, value, now, op.ttl_s, clock=op.clock,
                                 writer=op.writer)
                op.stored_on.append(me)
            else:
                op.awaiting += 1
                self._request(contact, lambda rpc: Store(rpc, self.node_id, op.target, value,
                                                         op.ttl_s, op.clock, op.writer,
                                                         self.step), op, now, eff)
        if op.awaiting == 0:
            self._finish(op, now, eff)

    def _finish(self, op: _Op, now: float, eff: Effects) -> None:
        if self._ops.pop(op.op_id, None) is None:
            return
        if op.then is not None:
            op.then(op, now, eff)
            return
        if op.kind not in PUBLIC_OPS:
            return
        lookup = op.lookup
        found: Value | None = lookup.value if lookup is not None else None
        if op.kind in (OpKind.PING, OpKind.CALL):
            contacts = tuple(op.stored_on)
        else:
            contacts = tuple(lookup.result()) if lookup is not None else ()
        eff.done.append(Done(
            op.op_id, op.kind, op.target, contacts,
            blob=found.value if found is not None else None,
            clock=found.clock if found is not None else op.clock,
            stored_on=tuple(op.stored_on) if op.kind in (OpKind.STORE, OpKind.LEAVE) else (),
            reply=op.reply, rounds=lookup.rounds if lookup is not None else 0,
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

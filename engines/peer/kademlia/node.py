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
from typing import Any, Callable, Collection, Iterable, Sequence

from actorpy.errors import ProtocolError

from .events import Done, Effects, KademliaConfig, NodeStats, OpKind, Send, SetTimer, TimerKind
from .gone import GonePeers
from .ids import KadId, random_id_in_range, short
from .messages import (MESSAGE_TYPES, NO_STEP, REPLY_KINDS, REQUEST_KINDS, Call, FindNode,
                       FindValue, Leave, Message, Nodes, Ping, Pong, Reply, Step, Store,
                       Stored, Value)
from .ops import NodeOps, _Op
from .routing import Contact, RoutingTable
from .rtt import ADAPTIVE_KINDS, RttEstimator
from .rpc import decode
from .sampling import SampleOp, Sampler, SubtreeCache
from .services import sample_depth, table_size_estimate
from .sizes import ValueSizes
from .steps import StepTable
from .storage import MemoryStorage, Storage
from .upkeep import Upkeep
from .values import Blob
from .window import Window, _Pending

log = logging.getLogger(__name__)

#: What an engine answers a CALL with: (status, args, value or None).
Answer = tuple[int, tuple[Any, ...], Any]
#: ``on_call(sender, call, now, effects) -> Answer``: runs on the node's thread; it may add
#: effects (e.g. start a ``set``) to the effects it is handed. None: no answer yet, the
#: engine sends it later (``answer_call``).
CallHandler = Callable[[Contact, Call, float, Effects], "Answer | None"]
#: ``accept_store(sender, store, now, effects) -> bool``: whether to take a STORE (an
#: engine's fence; a refused one is answered with the version held, so the writer sees it was
#: not taken); ``effects``: what taking it starts.
StoreFilter = Callable[[Contact, Store, float, Effects], bool]
NO_HANDLER = 0   # the status of a CALL that no engine handles


def _no_handler(sender: Contact, call: Call, now: float, eff: Effects) -> Answer:
    return NO_HANDLER, (), None


class KademliaNode(NodeOps, GonePeers):
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
        watchers: peers that PINGed us while ahead of us (a barrier waiting on us, likely);
            the engine tells them when our step moves (``take_watchers``).
    """

    def __init__(self, node_id: KadId, address: str, config: KademliaConfig | None = None,
                 rng: random.Random | None = None, storage: Storage | None = None,
                 now: float = 0.0) -> None:
        self.config = config or KademliaConfig()
        self.node_id = node_id
        self.address = address
        self.routing = RoutingTable(node_id, self.config.ksize, now)
        self._size, self._size_at = 1.0, -1     # size_estimate at routing.version _size_at
        self.storage: Storage = storage if storage is not None else MemoryStorage()
        self.stats = NodeStats()
        self.step = NO_STEP
        self.steps = StepTable()
        self.on_call: CallHandler = _no_handler
        self.accept_store: StoreFilter = lambda sender, store, now, eff: True
        self.watchers: dict[int, Contact] = {}
        self.subtrees = SubtreeCache()
        self.upkeep = Upkeep(self)
        self._rng = rng if rng is not None else random.Random(node_id)
        self._pending: dict[int, _Pending] = {}
        self._late: dict[int, _Pending] = {}    # timed out early, answer still taken
        self.window = Window(self, self.config.max_in_flight)   # per contact (window.py)
        self._rtt = RttEstimator(min(self.config.min_rpc_timeout_s, self.config.rpc_timeout_s),
                                 self.config.rpc_timeout_s)
        self.sizes = ValueSizes()   # per key, for request timeouts (an engine notes some ahead)
        self._ops: dict[int, _Op] = {}
        self._dead: dict[int, float] = {}
        self._left: set[int] = set()         # of those, the ones that said LEAVE (``alone``)
        self._evicted: dict[int, Contact] = {}   # the last evicted contacts (``probe_lately``)
        self._failures: dict[int, int] = {}
        self._probing: set[int] = set()      # table contacts with a PING in flight
        self._recheck_at: dict[int, float] = {}   # dead contact -> when others may make us
                                                  # PING it again (``_recheck_dead``)
        self._suspects: set[int] = set()     # table contacts that missed a reply: not handed out
        self._holders: dict[int, tuple[list[Contact], float]] = {}
        self.leaving = False                 # leave() began: an engine takes no more writes
        self.left = False                    # LEAVE sent: silent from now on
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

    def get(self, key: KadId, now: float, newest: bool = False) -> tuple[int, Effects]:
        """Start a FIND_VALUE lookup; ``Done.value`` and ``Done.clock`` give what was found.

        Args:
            newest: False (the paper's FIND_VALUE): a copy held here answers at once, else the
                first copy found ends the lookup. True: ask the k closest all the same and
                return the highest version among their copies and ours (a replica may lag).
        """
        record = self.storage.get(key, now)
        if record is not None and not newest:
            op_id = self._new_op_id()
            return op_id, Effects(done=[Done(op_id, OpKind.FIND_VALUE, key, blob=record.value,
                                             clock=record.clock)])
        return self._begin(OpKind.FIND_VALUE, key, now, newest=newest)

    def set(self, key: KadId, value: Any, now: float, ttl_s: float | None = None,
            clock: int | None = None, skip: Collection[int] = (),
            base: int = -1) -> tuple[int, Effects]:
        """Store ``value`` (bytes, numpy array or tensor) on the ``replication`` nodes closest
        to ``key``, with version ``(clock, this node)``; this node keeps a copy and renews it
        at every republish. ``clock`` defaults to one past the version held here (0 if none).
        ``skip``: ids of holders sent no STORE (an engine that gives them the value another
        way); they are still counted as holders, so no farther peer takes their place, and
        ``Done.asked`` leaves them out. ``base``: the clock this writer's branch grew from
        (``Store.base``; -1: none; ``ops._on_reply`` counts the answers it makes refusals).

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
        fields = dict(value=blob, ttl_s=ttl, clock=clock, writer=self.node_id,
                      skip=frozenset(skip), base=base)
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

    def sample_cached(self, beta: int, rng: random.Random, now: float) -> list[Contact] | None:
        """What ``sample_peers`` would draw, when it needs no message (every subtree cached):
        the sampled peers at once, with no operation to finish; else None, nothing drawn."""
        depth = sample_depth(self.size_estimate(), self.config.ksize)
        picks = self._sampler.cached_sample(beta, depth, rng, now)
        if picks is not None:
            self._new_op_id()       # as sample_peers would: later operations keep their ids
        return picks

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
                                                blob, self.step), op, now, eff, key=key)
        return op.op_id, eff

    def leave(self, now: float) -> tuple[int, Effects]:
        """Leave gracefully: hand every key held to its closest other peers, then tell every
        contact (LEAVE) so they drop this node at once. Ends in a Done (``stored_on``: the
        peers that took keys); the shell may stop the node after it."""
        op = self._single(OpKind.LEAVE, self.node_id, now)
        self.leaving = True
        eff = Effects()
        self.upkeep.leave(op, now, eff)
        return op.op_id, eff

    def tell_step(self, contact: Contact) -> Send:
        """A STEP to ``contact`` carrying our step: one-way (no answer, no timeout), for a
        watcher (``take_watchers``), where a PING would cost a PONG."""
        return Send(contact.address, Step(0, self.node_id, self.step))

    def take_watchers(self) -> list[Contact]:
        """The peers that asked for our step while ahead of us, once each (then forgotten)."""
        watchers, self.watchers = list(self.watchers.values()), {}
        return watchers

    def drop_contact(self, address: str, now: float) -> tuple[bool, Effects]:
        """Forget the contact at ``address`` (a peer that answered with garbage, as its
        shell judged it): evicted as a dead one would be, its keys re-replicated. Returns
        whether it was in the table, and the effects."""
        eff = Effects()
        node_id = self.routing.id_at(address)
        if node_id is None:
            return False, eff
        self._evict(node_id, now, eff)
        return True, eff

    def holders_of(self, key: KadId, now: float) -> list[Contact] | None:
        """The other peers ``set(key)`` would store on now, if its last lookup for the key is
        still cached (``holders_cache_s``), else None."""
        cached = self._holders.get(key)
        if cached is None or now >= cached[1]:
            return None
        me = Contact(self.node_id, self.address)
        chosen = sorted([*cached[0], me], key=lambda c: c.node_id ^ key)[:self.config.copies]
        return [c for c in chosen if c != me]

    def answer_call(self, sender: Contact, call: Call, answer: Answer) -> Send:
        """The REPLY to a CALL whose handler returned None (answered later)."""
        return Send(sender.address, self._reply(sender, call, answer))

    def _reply(self, sender: Contact, call: Call, answer: Answer) -> Reply:
        status, args, value = answer
        gossip = self.steps.digest(self.config.gossip_steps, exclude=sender.node_id)
        reply = Reply(call.rpc_id, self.node_id, status, tuple(args), value, self.step, gossip)
        if reply.value is not None:
            self.sizes.pace.moved(sender.node_id, reply.value.nbytes)
        return reply

    def rpc_timeout(self, node_id: int) -> float:
        """How long a PING or FIND_NODE sent to ``node_id`` now would wait for its answer
        (adaptive, see ``KademliaConfig.min_rpc_timeout_s``)."""
        return self._rtt.timeout(node_id)

    def size_estimate(self) -> float:
        """Network size estimated from id density in our routing table (this node counted)."""
        # asked at every barrier check and sample: recomputed only when the contacts change
        version = self.routing.version
        if self._size_at != version:
            self._size, self._size_at = table_size_estimate(self.routing), version
        return self._size

    # ------------------------------------------------------------ shell calls
    def receive(self, sender_address: str, message: object, now: float,
                frames: Sequence[object] = ()) -> Effects:
        """Handle one message from ``sender_address``: a decoded ``Message``, or its wire form
        (``rpc.encode``) with the value ``frames`` that came after it.

        Raises:
            ProtocolError: malformed, unsolicited, or claiming an id it does not own; nothing
                was changed. The shell logs it and keeps serving.
        """
        if self.left:
            # we told every contact we left: answering now would put us back in its table
            # (a live contact its fence would still defer to), so stay silent
            return Effects()
        if type(message) not in MESSAGE_TYPES:
            # anything but our own message objects is wire data from a peer: validate it all
            message = decode(message, frames, max_contacts=self.config.ksize,
                             max_value_bytes=self.config.max_value_bytes)
        assert type(message) in MESSAGE_TYPES
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
                self._left.add(sender.node_id)
                self._fail_pending_to(sender.node_id, now, eff)
            return eff
        if isinstance(message, Step):           # one-way: its step is all it says
            self._note_alive(sender, message.step, now, eff)
            return eff
        if message.KIND in REQUEST_KINDS:
            self._note_alive(sender, message.step, now, eff)
            if isinstance(message, (Store, Call)) and message.value is not None:
                self.sizes.note(message.key, message.value.nbytes)
                self.sizes.pace.moved(sender.node_id, message.value.nbytes)
            # the answer goes out before what answering started (an owner's replication
            # STOREs): the asker waits for it, the STOREs' holders do not
            started = Effects()
            answer = self._answer(sender, message, now, started)
            if answer is not None:          # None: a CALL the engine answers later
                eff.sends.append(Send(sender_address, answer))
            eff.extend(started)
            return eff
        pending = self._pending.get(message.rpc_id)
        late = pending is None
        if late:
            pending = self._late.get(message.rpc_id)
        if pending is None or pending.contact.address != sender_address:
            raise ProtocolError(f"unsolicited {message.KIND.name} from {sender_address}")
        if pending.contact.node_id != sender.node_id:
            raise ProtocolError(f"{sender_address} answered under another id")
        if message.KIND not in REPLY_KINDS[pending.kind]:
            raise ProtocolError(f"{message.KIND.name} does not answer {pending.kind.name}")
        if isinstance(message, Value) and message.key != pending.key:
            raise ProtocolError("VALUE for a key that was not asked for")
        self.window.heard(sender.node_id, now)      # it answers us: alive (window.py)
        # the size of a value it brings (the CALL's key for a REPLY), the link's pace
        self.sizes.answered(pending.key, sender.node_id, message, now - pending.sent_s)
        if isinstance(message, Reply):
            for node_id, peer_step in message.peer_steps:
                if node_id != self.node_id and node_id != sender.node_id:
                    self.steps.hear_of(node_id, peer_step)
        if late:
            del self._late[message.rpc_id]
            self._on_late(pending, sender, message, now, eff)
            return eff
        del self._pending[message.rpc_id]
        self.window.done(message.rpc_id, now, eff)
        if pending.kind in ADAPTIVE_KINDS:
            self._rtt.observe(sender.node_id, now - pending.sent_s)
        self._answered(pending, sender, message, now, eff)
        return eff

    def on_timer(self, kind: TimerKind, token: int, now: float) -> Effects:
        """A timer set through ``SetTimer`` is due."""
        eff = Effects()
        if self.left:
            return eff                      # left: no more replica checks, refreshes, ...
        if kind == TimerKind.RPC_TIMEOUT:
            pending = self._pending.pop(token, None)
            if pending is not None:
                self.window.done(token, now, eff)
                self._on_timeout(token, pending, now, eff)
            elif token in self._late:
                self._expire_late(token, now, eff)
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

    def _fail_pending_to(self, node_id: int, now: float, eff: Effects) -> None:
        """``node_id`` left: what we asked it will never be answered, so it fails now
        rather than at its timeout."""
        for rpc_id in [r for r, p in self._pending.items() if p.contact.node_id == node_id]:
            pending = self._pending.pop(rpc_id)
            op = self._ops.get(pending.op_id) if pending.op_id is not None else None
            if op is not None:
                op.in_flight -= 1
            self._give_up(pending, op, now, eff)
        for rpc_id in [r for r, p in self._late.items()
                       if p.contact.node_id == node_id and p.final]:
            pending = self._late.pop(rpc_id)      # a PING given up on, waiting for its end
            op = self._ops.get(pending.op_id) if pending.op_id is not None else None
            if op is not None and op.lookup is None:
                self._give_up(pending, op, now, eff)

    def _answer(self, sender: Contact, message: Message, now: float,
                eff: Effects) -> Message | None:
        me, step = self.node_id, self.step
        if isinstance(message, Ping):
            if message.step > step >= 0:
                # asked for our step by a peer ahead of us: it may be waiting on us
                self.watchers[sender.node_id] = sender
            return Pong(message.rpc_id, me, step)
        if isinstance(message, Store):
            taken = self.accept_store(sender, message, now, eff)
            if taken:
                self.storage.put(message.key, message.value, now,
                                 min(message.ttl_s, self.config.ttl_s), clock=message.clock,
                                 writer=message.writer)
            held = self.storage.get(message.key, now)
            clock, writer = (held.clock, held.writer) if held is not None else (0, KadId(0))
            return Stored(message.rpc_id, me, clock, writer, step, refused=not taken)
        if isinstance(message, Call):
            answer = self.on_call(sender, message, now, eff)
            return None if answer is None else self._reply(sender, message, answer)
        if isinstance(message, FindValue):
            record = self.storage.get(message.key, now)
            if record is not None:
                self.sizes.pace.moved(sender.node_id, record.value.nbytes)
                return Value(message.rpc_id, me, message.key, record.value, record.clock,
                             record.writer, step)
            target = message.key
        else:
            assert isinstance(message, FindNode)
            target = message.target
        return Nodes(message.rpc_id, me, tuple(self._closest(target, message.sender_id)), step)

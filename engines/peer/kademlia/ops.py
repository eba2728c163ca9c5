"""The machinery under ``KademliaNode``: requests with timeouts and retries, lookups, the
STORE phase, liveness accounting, and how operations finish (``Done`` or a callback).

``NodeOps`` holds no state of its own: ``KademliaNode.__init__`` creates every attribute it
uses (declared below for the type checker). The node's public calls, ``receive`` and the
answers to requests are in ``node.py``.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .events import PUBLIC_OPS, Done, Effects, KademliaConfig, NodeStats, OpKind, SetTimer, \
    TimerKind
from .ids import KadId, random_id_in_range, shared_prefix_len, short
from .lookup import Lookup
from .messages import NO_STEP, FindNode, FindValue, Kind, Message, Nodes, Ping, Pong, Reply, \
    Store, Stored, Value
from .routing import Contact, RoutingTable
from .rtt import ADAPTIVE_KINDS, READ_KINDS, RttEstimator
from .sampling import SubtreeCache
from .sizes import ValueSizes
from .steps import StepTable
from .storage import Storage
from .upkeep import STORE_OPS, Upkeep
from .values import Blob
from .window import Window, _Pending

log = logging.getLogger("engines.peer.kademlia.node")


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
    skip: frozenset[int] = frozenset()  # STORE phase: holders sent nothing (``set(skip=)``)
    base: int = -1                      # ... the clock its branch grew from (``Store.base``)
    newest: bool = False                # FIND_VALUE: the highest version of the k closest
    awaiting: int = 0
    stored_on: list[Contact] = field(default_factory=list)
    holders: int = 0                    # STORE phase: other peers asked to store
    confirmed: int = 0                  # ... that answered holding the version written
    # ... that answered holding another version: (peer, clock, writer) of what each held
    refusals: list[tuple[Contact, int, KadId]] = field(default_factory=list)
    reply: Reply | None = None
    in_flight: int = 0
    rpcs: int = 0
    then: Callable[[_Op, float, Effects], None] | None = None  # internal ops: instead of Done


class NodeOps:
    """Operation machinery shared by every ``KademliaNode`` (see the module docstring)."""

    config: KademliaConfig
    node_id: KadId
    address: str
    routing: RoutingTable
    storage: Storage
    stats: NodeStats
    step: int
    steps: StepTable
    subtrees: SubtreeCache
    upkeep: Upkeep
    _rng: random.Random
    _pending: dict[int, _Pending]
    _late: dict[int, _Pending]
    _rtt: RttEstimator
    window: Window
    sizes: ValueSizes
    _ops: dict[int, _Op]
    _dead: dict[int, float]
    _left: set[int]
    _evicted: dict[int, Contact]
    _failures: dict[int, int]
    _probing: set[int]
    _recheck_at: dict[int, float]
    _suspects: set[int]
    _holders: dict[int, tuple[list[Contact], float]]
    _next_op: int

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
        self._left.discard(node_id)
        self._recheck_at.pop(node_id, None)
        self._failures.pop(node_id, None)
        self._suspects.discard(node_id)
        if node_id not in self.routing:
            self.subtrees.admit(contact)
        oldest = self.routing.observe(contact, now)
        if oldest is not None:
            # Full bucket: keep the old contact unless it fails its PINGs (paper 2.2).
            self._probe(oldest, now, eff)

    def _probe(self, contact: Contact, now: float, eff: Effects) -> int | None:
        """PING ``contact`` outside any operation (unless one is in flight); its rpc id."""
        if contact.node_id in self._probing:
            return None
        self._probing.add(contact.node_id)
        return self._request(contact, lambda rpc: Ping(rpc, self.node_id, self.step), None,
                             now, eff)

    def _recheck_dead(self, contacts: Sequence[Contact], now: float, eff: Effects) -> None:
        """Another peer hands out contacts we dropped as dead: PING each again (at most once
        per ``10 x rpc_timeout_s``), outside the lookup, which still skips them. A peer
        dropped for replies that were only late (a loaded machine; training's 0.1 s
        timeout) so comes back within a second or so, where it was skipped for the whole
        ``dead_for_s`` before: its pushers kept asking peers that answered NOT_OWNER, and
        a 2-step job of 40 peers on 2 cores took 62 s instead of 1.4 s. A dead one costs a
        PING that times out, and is neither evicted again nor re-replicated for."""
        for contact in contacts:
            node_id = contact.node_id
            if self._is_dead(node_id, now) and now >= self._recheck_at.get(node_id, 0.0):
                self._recheck_at[node_id] = now + 10 * self.config.rpc_timeout_s
                self._probe(contact, now, eff)

    def _evict(self, node_id: int, now: float, eff: Effects, keys: bool = True) -> None:
        """``node_id`` is dead or left: forget it everywhere, then (``keys``; False when
        ``_keys_at_risk`` did it already) re-replicate its keys."""
        self._dead[node_id] = now + self.config.dead_for_s
        gone = self.routing.get(node_id)
        if gone is not None:                # for ``probe_lately``, the last 64
            self._evicted.pop(node_id, None)
            self._evicted[node_id] = gone
            if len(self._evicted) > 64:
                del self._evicted[next(iter(self._evicted))]
        self._failures.pop(node_id, None)
        self._suspects.discard(node_id)
        self._rtt.forget(node_id)
        self.routing.remove(node_id)
        self.subtrees.forget(node_id)
        self.steps.forget(node_id)
        self.window.forget(node_id, now, eff)   # its queued requests are given up now
        if keys:
            self._keys_at_risk(node_id, now, eff)

    def _keys_at_risk(self, node_id: int, now: float, eff: Effects) -> None:
        """``node_id`` is gone, or given up on: write no more to it as a cached holder, and
        store again the keys it held with us (extra copies at worst, if it is alive)."""
        for key in [k for k, (held, _) in self._holders.items()
                    if any(c.node_id == node_id for c in held)]:
            del self._holders[key]
        self.upkeep.peer_gone(node_id, now, eff)

    def _closest(self, target: int, exclude: int | None = None) -> list[Contact]:
        """Our k closest contacts, leaving out suspects (so a contact that missed one reply is
        neither handed to others nor used as a lookup seed until it answers again)."""
        skip = self._suspects if exclude is None else self._suspects | {exclude}
        return self.routing.closest(target, self.config.ksize, exclude=frozenset(skip))

    def _request(self, contact: Contact, make: Callable[[int], Message], op: _Op | None,
                 now: float, eff: Effects, key: int = 0, retry: bool = False) -> int:
        rpc_id = self._rng.getrandbits(63)
        while rpc_id in self._pending or rpc_id in self._late:
            rpc_id = self._rng.getrandbits(63)
        message = make(rpc_id)
        if message.KIND in ADAPTIVE_KINDS:     # plus the wait behind a value (``sizes``)
            late = self.sizes.behind_s(self.config, contact.node_id)
            timeout = self._rtt.timeout(contact.node_id) + late
            limit = self.config.rpc_timeout_s + late
        else:       # a value's allowance on top (``sizes.py``)
            timeout = limit = self.sizes.wait_s(self.config, message, self.storage, retry,
                                                 contact.node_id)
        self._pending[rpc_id] = _Pending(contact, message.KIND, op.op_id if op else None, make,
                                         key, now, limit, now)
        self.stats.rpcs_sent += 1
        if op is not None:
            op.rpcs += 1
            op.in_flight += 1
            if op.lookup is not None and op.awaiting == 0:
                self.stats.max_in_flight = max(self.stats.max_in_flight, op.in_flight)
        self.window.send(contact, rpc_id, message, timeout, eff)     # or queued (window.py)
        return rpc_id

    def _begin(self, kind: OpKind, target: KadId, now: float, eff: Effects | None = None,
               **fields: object) -> tuple[int, Effects]:
        eff = eff if eff is not None else Effects()
        op = _Op(self._new_op_id(), kind, target, now, **fields)  # type: ignore[arg-type]
        seeds = self._closest(target)
        op.lookup = Lookup(target, seeds, ksize=self.config.ksize, alpha=self.config.alpha,
                           own_id=self.node_id, stop_at_value=not op.newest)
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
            # (another writer at the same clock: the same copy, e.g. a seed taken over, but
            # past the clock of a write's base (``Store.base``): another branch. A refused
            # write is not held whatever the clock: an owner that dropped a branch writes its
            # clocks again, and a round was counted durable on another branch's copy)
            taken = not message.refused and message.clock == op.clock and (
                op.clock <= op.base or message.writer in (op.writer, 0))
            op.confirmed += taken
            if not taken:
                op.refusals.append((sender, message.clock, message.writer))
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
            failures, most = self._failures, self.config.max_failures
            # skip the dead and, but in a FIND_VALUE (an owner's take-over reads every
            # holder), those given up on whose eviction waits (``_on_timeout``)
            fresh = [c for c in message.contacts
                     if (c.node_id not in dead or not self._is_dead(c.node_id, now))
                     and (op.kind == OpKind.FIND_VALUE or failures.get(c.node_id, 0) < most)]
            if len(fresh) < len(message.contacts):
                self._recheck_dead(message.contacts, now, eff)
            op.lookup.on_nodes(sender.node_id, fresh)
        self._pump(op, now, eff)

    def _on_timeout(self, rpc_id: int, pending: _Pending, now: float, eff: Effects) -> None:
        node_id = pending.contact.node_id
        self.stats.timeouts += 1
        # a first try to a contact that answered us since it was sent is no miss: its answer
        # waits in the contact's inbox behind others (a step of many keys; window.py); nor
        # is a CALL's or STORE's retry: a PUSH's answer waits for its round's STOREs, queued
        # behind the owner's other rounds (two such misses evicted live owners: "Many keys")
        busy = (pending.first_s == pending.sent_s or pending.kind in (Kind.CALL, Kind.STORE)) \
            and self.window.busy(node_id, pending.sent_s)
        failures = self._failures.get(node_id, 0) + (not busy)
        self._failures[node_id] = failures
        if pending.kind == Kind.PING:
            self._probing.discard(node_id)
        log.debug("%s: %s timed out (%s, miss %d)", short(self.node_id),
                  pending.contact.address, pending.kind.name, failures)
        op = self._ops.get(pending.op_id) if pending.op_id is not None else None
        if op is not None:
            op.in_flight -= 1
        if pending.kind in ADAPTIVE_KINDS:
            self._rtt.backoff(node_id)      # the retry waits twice as long
        else:                               # ... as much longer per MB, if it moves a value
            self.sizes.pace.timed_out(node_id, rpc_id)
        retry = None
        if failures < self.config.max_failures:
            # One miss may be one lost message: ask again before giving up on the contact
            # (the paper's LRS PING rule, made tolerant of loss); meanwhile it is not handed
            # out. A running operation keeps waiting for the retry, so loss costs it time, not
            # exactness.
            if node_id in self.routing and not busy:
                self._suspects.add(node_id)
            if op is not None:
                retry = self._request(pending.contact, pending.make, op, now, eff,
                                      key=pending.key, retry=True)
                # a retry that waits longer (a read of a size never seen, a slow link): the
                # first try's answer is taken until the retry's deadline too
                pending.limit_s = max(pending.limit_s,
                                      now - pending.sent_s + self._pending[retry].limit_s)
            elif node_id in self.routing:
                retry = self._probe(pending.contact, now, eff)
            if retry is not None:
                self._pending[retry].first_s = pending.first_s
            self._keep_late(rpc_id, pending, retry, now, eff)
        elif self._keep_late(rpc_id, pending, None, now, eff, final=True):
            # consecutive misses, the last one before rpc_timeout_s: a lookup goes on
            # without the contact and its keys are stored again now (as the eviction did
            # before: extra copies at worst), but the eviction (out of the table, the steps,
            # the samples) and the end of a PING wait until ``_late_until`` passed with no
            # answer (``_expire_late``), so a live peer that is only slow keeps its place.
            # One that answered us since the first try is busy, not dead: its keys wait for
            # its eviction (each give-up of a loaded peer stored every key again: window.py)
            if failures == self.config.max_failures \
                    and not self.window.busy(node_id, pending.first_s):
                self._keys_at_risk(node_id, now, eff)
            if op is not None and op.lookup is not None:
                self._give_up(pending, op, now, eff)
        else:
            self._evict(node_id, now, eff)      # consecutive misses: dead (or gone)
            self._give_up(pending, op, now, eff)

    def _keep_late(self, rpc_id: int, pending: _Pending, retry: int | None, now: float,
                   eff: Effects, final: bool = False) -> bool:
        """Remember a request timed out before its ``limit_s`` until then, so its answer is
        still taken if it comes late (``_on_late``), not refused as unsolicited; False if
        ``limit_s`` has passed."""
        pending.retry, pending.final = retry, final
        left = self._late_until(pending) - now
        if left <= 1e-3:
            return False
        self._late[rpc_id] = pending
        eff.timers.append(SetTimer(left, TimerKind.RPC_TIMEOUT, rpc_id))
        return True

    def _late_until(self, pending: _Pending) -> float:
        """Until when the answer to a request that timed out is taken: ``limit_s`` after it
        was sent; for a contact's last try of a PING or FIND_NODE (the eviction waits for
        it), ``max_failures x rpc_timeout_s`` after the first, as with fixed timeouts (an
        adaptive first try waited less, and a slow live peer was evicted sooner)."""
        until = pending.sent_s + pending.limit_s
        if pending.final and pending.kind in ADAPTIVE_KINDS:
            most = pending.first_s + self.config.max_failures * self.config.rpc_timeout_s
            until = max(until, most)
        return until

    def _expire_late(self, rpc_id: int, now: float, eff: Effects) -> None:
        """A timer of a request in ``_late`` fell due: forget it once its ``limit_s`` has
        passed since it was sent (a retry answered through ``_on_late`` still has its own
        adaptive timer running: that one re-arms for the rest)."""
        pending = self._late[rpc_id]
        left = self._late_until(pending) - now
        if left > 1e-3:
            eff.timers.append(SetTimer(left, TimerKind.RPC_TIMEOUT, rpc_id))
            return
        del self._late[rpc_id]
        if not pending.final:
            return
        node_id = pending.contact.node_id
        if self._failures.get(node_id, 0) >= self.config.max_failures:
            # no answer since its last miss: dead (or gone); its keys were seen to at the
            # give-up, unless it was busy then (``_on_timeout``)
            self._evict(node_id, now, eff, keys=self.window.busy(node_id, pending.first_s))
        op = self._ops.get(pending.op_id) if pending.op_id is not None else None
        if op is not None and op.lookup is None:
            self._give_up(pending, op, now, eff)      # a PING that was never answered

    def _on_late(self, pending: _Pending, sender: Contact, message: Message, now: float,
                 eff: Effects) -> None:
        """An answer after its request timed out (checked like any reply): the contact is
        alive (no eviction, no suspicion), its round trip is measured, and when the request
        is a read whose retry is still unanswered, this answers the retry (a lookup waiting
        on it goes on; the retry's own answer is then dropped as late). Otherwise, for a
        STORE or CALL whose retry runs or whose operation ended, only the liveness counts."""
        self.stats.late_replies += 1
        if pending.kind in ADAPTIVE_KINDS:
            self._rtt.observe(sender.node_id, now - pending.sent_s)
        retry = self._pending.get(pending.retry) if pending.retry is not None else None
        if pending.kind not in READ_KINDS:
            self._note_alive(sender, message.step, now, eff)
            return
        if retry is None:
            # no retry left: a PING still waits for it, and a lookup still running that gave
            # up on the contact takes the answer all the same
            op = self._ops.get(pending.op_id) if pending.op_id is not None else None
            if op is not None and (op.lookup is None or (not op.lookup.is_done
                                   and op.lookup.revive(sender.node_id))):
                op.in_flight += 1
                self._answered(pending, sender, message, now, eff)
            else:
                self._note_alive(sender, message.step, now, eff)
            return
        assert pending.retry is not None
        del self._pending[pending.retry]
        self.window.done(pending.retry, now, eff)
        self._keep_late(pending.retry, retry, None, now, eff)
        self._answered(retry, sender, message, now, eff)

    def _answered(self, pending: _Pending, sender: Contact, message: Message, now: float,
                  eff: Effects) -> None:
        """The reply to ``pending`` (already taken out of ``_pending``) arrived."""
        if pending.kind == Kind.PING:
            self._probing.discard(sender.node_id)
        self._note_alive(sender, message.step, now, eff)
        op = self._ops.get(pending.op_id) if pending.op_id is not None else None
        if op is not None:
            op.in_flight -= 1
            self._on_reply(op, sender, message, now, eff)

    def _give_up(self, pending: _Pending, op: _Op | None, now: float, eff: Effects) -> None:
        """An operation's request to a peer now evicted will get no answer: go on without."""
        node_id = pending.contact.node_id
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
            if op.kind == OpKind.STORE and self.config.holders_cache_s > 0 and found:
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
            elif contact.node_id not in op.skip:
                op.awaiting += 1
                self._request(contact, lambda rpc: Store(rpc, self.node_id, op.target, value,
                                                         op.ttl_s, op.clock, op.writer,
                                                         self.step, op.base), op, now, eff)
        op.holders = op.awaiting
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
        if op.newest and lookup is not None:
            found = self._newest(op.target, lookup.values, now)
        if op.kind in (OpKind.PING, OpKind.CALL):
            contacts = tuple(op.stored_on)
        else:
            contacts = tuple(lookup.result()) if lookup is not None else ()
        eff.done.append(Done(
            op.op_id, op.kind, op.target, contacts,
            blob=found.value if found is not None else None,
            clock=found.clock if found is not None else op.clock,
            stored_on=tuple(op.stored_on) if op.kind in (OpKind.STORE, OpKind.LEAVE) else (),
            durable=op.kind == OpKind.STORE and op.confirmed == op.holders,
            refusals=tuple(op.refusals), asked=op.holders,
            reply=op.reply, rounds=lookup.rounds if lookup is not None else 0,
            rpcs=op.rpcs, elapsed_s=now - op.started_s))

    def _newest(self, key: KadId, values: list[Value], now: float) -> Value | None:
        """The highest version among the copies a lookup found and our own."""
        best = max(values, key=lambda v: (v.clock, v.writer), default=None)
        record = self.storage.get(key, now)
        if record is not None and (best is None or record.version > (best.clock, best.writer)):
            best = Value(0, self.node_id, key, record.value, record.clock, record.writer)
        return best

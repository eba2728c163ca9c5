"""Uniform peer samples and overlay enumeration from complete id-space subtrees.

PSP needs each check's β peers drawn uniformly without replacement (papers.md). The node
closest to a random id is not uniform (its XOR cell varies by orders of magnitude), and
keeping several neighbours of one lookup at a time is not either: a peer with many
neighbours competes with them (the old sampler drew some peers 1.5x their share at N = 100,
β = 1). Each *draw* here picks one peer with the same chance for every peer:

1. a uniformly random ``target`` picks the depth-``d`` subtree holding it (chance ``2**-d``);
2. a uniform ``slot`` in ``[0, M)`` picks the ``slot``-th member (by id) of that subtree's
   complete membership; an empty slot, ourselves or a peer already chosen rejects the draw.

So each peer is picked with chance ``2**-d / M`` per draw, whatever the gaps between ids, and
rejecting repeats makes the first β distinct picks a uniform β-subset. ``d`` comes from the
size estimate (a subtree then holds ~0.6 k peers) and ``M = 2k``; a subtree with more than
``M`` members (Poisson tail, ~1e-10) uses the half holding ``target`` and ``slot // 2``, which
keeps every chance equal.

A subtree's membership is complete when a lookup of an id inside it returns fewer than k
contacts in it (any member is closer to the target than every non-member); otherwise both
halves are looked up in turn. Memberships are cached for ``sample_cache_s``, so once every
subtree has been seen a sample costs no message at all; the node drops dead peers from the
cache when it evicts them and adds live newcomers it hears from.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Protocol

from .events import Effects
from .ids import ID_BITS, KadId, shared_prefix_len
from .routing import Contact

#: Slots per subtree, as a multiple of k (acceptance ~0.3 at 0.6 k members per subtree).
SLOTS_PER_K = 2
#: The most subtree discoveries one operation runs at once.
MAX_PARALLEL = 8
#: ``members()`` refuses overlays split into more subtrees than this (BSP over > ~50k peers).
MAX_ENUMERATED_SUBTREES = 4096


def prefix_of(node_id: int, depth: int) -> int:
    """The first ``depth`` bits of an id, as an int (0 for depth 0).

    >>> prefix_of(0b1011 << 156, 2), prefix_of(123, 0)
    (2, 0)
    """
    return node_id >> (ID_BITS - depth) if depth else 0


def in_subtree(target: int, depth: int, rng: random.Random) -> KadId:
    """A uniformly random id sharing ``target``'s first ``depth`` bits."""
    low = ID_BITS - depth
    return KadId((prefix_of(target, depth) << low) | rng.getrandbits(low) if low else target)


@dataclass
class _Entry:
    members: list[Contact]     # sorted by id
    expires_at: float


class SubtreeCache:
    """Complete memberships of subtrees, keyed by (depth, prefix), each valid until it expires.

    >>> cache = SubtreeCache()
    >>> cache.put(KadId(0), 1, [Contact(KadId(5), "a")], expires_at=10.0)
    >>> [c.address for c in cache.members(KadId(7), 1, now=0.0)], cache.members(KadId(7), 1, 10.0)
    (['a'], None)
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[int, int], _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def members(self, target: int, depth: int, now: float) -> list[Contact] | None:
        """The members of ``target``'s depth-``depth`` subtree, if known (from it or from a
        cached bigger subtree holding it)."""
        for d in range(depth, -1, -1):
            entry = self._entries.get((d, prefix_of(target, d)))
            if entry is None:
                continue
            if now >= entry.expires_at:
                del self._entries[(d, prefix_of(target, d))]
                continue
            if d == depth:
                return entry.members
            return [c for c in entry.members if shared_prefix_len(c.node_id, target) >= depth]
        return None

    def put(self, target: int, depth: int, members: list[Contact], expires_at: float) -> None:
        """Remember the complete membership of ``target``'s depth-``depth`` subtree."""
        self._entries[(depth, prefix_of(target, depth))] = _Entry(
            sorted(members, key=lambda c: c.node_id), expires_at)

    def forget(self, node_id: int) -> None:
        """A peer died or left: drop it from every subtree (they stay complete)."""
        for (depth, prefix), entry in self._entries.items():
            if prefix_of(node_id, depth) == prefix:
                entry.members = [c for c in entry.members if c.node_id != node_id]

    def admit(self, contact: Contact) -> None:
        """A live peer we just heard from: add it to the subtrees it belongs to."""
        for (depth, prefix), entry in self._entries.items():
            if prefix_of(contact.node_id, depth) == prefix and all(
                    c.node_id != contact.node_id for c in entry.members):
                entry.members = sorted([*entry.members, contact], key=lambda c: c.node_id)


class StartLookup(Protocol):
    """How the sampler asks its node for a FIND_NODE lookup; the node later calls
    ``on_result(closest, rpcs, now, effects)``."""

    def __call__(self, target: KadId, now: float, eff: Effects,
                 on_result: Callable[[list[Contact], int, float, Effects], None]) -> None: ...


Ready = Callable[[list[Contact], float, Effects], None]


@dataclass
class SampleOp:
    """One sample (``beta`` >= 0) or enumeration (``beta`` is None) in progress."""

    op_id: int
    beta: int | None
    depth: int
    rng: random.Random
    started_s: float
    on_done: Callable[[SampleOp, float, Effects], None]
    chosen: dict[int, Contact] = field(default_factory=dict)
    known: dict[tuple[int, int], list[Contact]] = field(default_factory=dict)
    draws: list[tuple[KadId, int]] = field(default_factory=list)
    pending: set[tuple[int, int]] = field(default_factory=set)
    drawn: int = 0
    rpcs: int = 0
    busy: bool = False
    finished: bool = False


class Sampler:
    """Runs sample and enumeration operations for one node.

    Args:
        own_id: the node's id (never sampled).
        ksize: the overlay's k.
        cache: the node's subtree cache.
        cache_ttl_s: how long a discovered membership is reused (0: within one op only).
        lookup: starts a FIND_NODE lookup on the node (see ``StartLookup``).
    """

    def __init__(self, own_id: KadId, ksize: int, cache: SubtreeCache, cache_ttl_s: float,
                 lookup: StartLookup) -> None:
        self.own_id = own_id
        self.ksize = ksize
        self.slots = SLOTS_PER_K * ksize
        self.cache = cache
        self.cache_ttl_s = cache_ttl_s
        self._lookup = lookup
        self._waiting: dict[tuple[int, int], list[Ready]] = {}

    # ------------------------------------------------------------------ operations
    def sample(self, op: SampleOp, now: float, eff: Effects) -> None:
        """Draw until ``op.beta`` distinct peers are chosen (or the overlay has no more).

        When every depth-``op.depth`` subtree is cached, the draws are skipped: the accepted
        draws are a uniform subset of all the peers but us, so ``rng.sample`` of their union
        is the same distribution, without the rejected draws (most of them on a small
        overlay: 2 peers accept 1 draw in 2k)."""
        assert op.beta is not None
        picks = self.cached_sample(op.beta, op.depth, op.rng, now)
        if picks is None:
            self._advance(op, now, eff)
            return
        for pick in picks:
            op.chosen[pick.node_id] = pick
        self._end(op, now, eff)

    def cached_sample(self, beta: int, depth: int, rng: random.Random,
                      now: float) -> list[Contact] | None:
        """``sample``'s draw when every depth-``depth`` subtree is cached (``beta`` distinct
        other peers, or all of them if fewer), else None (nothing drawn from ``rng``)."""
        everyone = self._everyone_cached(depth, now)
        if everyone is None:
            return None
        others = [c for c in everyone if c.node_id != self.own_id]
        return rng.sample(others, min(beta, len(others)))

    def _everyone_cached(self, depth: int, now: float) -> list[Contact] | None:
        """Every peer of the overlay, if each depth-``depth`` subtree is cached (and there
        are at most ``MAX_PARALLEL`` of them to look at), else None."""
        if 1 << depth > MAX_PARALLEL:
            return None
        everyone: list[Contact] = []
        for prefix in range(1 << depth):
            members = self.cache.members(KadId(prefix << (ID_BITS - depth) if depth else 0),
                                         depth, now)
            if members is None:
                return None
            everyone.extend(members)
        return everyone

    def enumerate(self, op: SampleOp, now: float, eff: Effects) -> None:
        """Collect the complete membership of every depth-``op.depth`` subtree."""
        subtrees = 1 << op.depth
        if subtrees > MAX_ENUMERATED_SUBTREES:
            raise ValueError(f"the overlay has ~{subtrees} subtrees at depth {op.depth}: too "
                             "large to enumerate every peer; use a sampled barrier (PSP)")
        op.busy = True
        for prefix in range(subtrees):
            target = KadId((prefix << (ID_BITS - op.depth)) if op.depth else 0)
            self._need(op, in_subtree(target, op.depth, op.rng), now, eff)
        op.busy = False
        self._try_enumerated(op, now, eff)

    # ------------------------------------------------------------------ drawing
    def _advance(self, op: SampleOp, now: float, eff: Effects) -> None:
        assert op.beta is not None
        if op.busy:
            return                          # the outer loop goes on with what just arrived
        op.busy = True
        limit = 60 * op.beta + 400          # overlays with fewer than beta others end here
        while len(op.chosen) < op.beta and op.drawn < limit:
            self._refill(op, now, eff)
            target, slot = op.draws[0]
            members = op.known.get((op.depth, prefix_of(target, op.depth)))
            if members is None:
                op.busy = False
                return                      # resumes when that subtree's discovery ends
            op.draws.pop(0)
            op.drawn += 1
            pick = self._pick(members, target, op.depth, slot)
            if pick is not None and pick.node_id != self.own_id:
                op.chosen.setdefault(pick.node_id, pick)
        op.busy = False
        self._end(op, now, eff)

    def _refill(self, op: SampleOp, now: float, eff: Effects) -> None:
        """Keep enough draws queued (and their subtrees being discovered) for what is left."""
        assert op.beta is not None
        wanted = min(MAX_PARALLEL, 1 + 3 * (op.beta - len(op.chosen)))
        while len(op.draws) < wanted:
            op.draws.append((KadId(op.rng.getrandbits(ID_BITS)), op.rng.randrange(self.slots)))
        for target, _ in op.draws:
            if len(op.pending) >= MAX_PARALLEL:
                break
            self._need(op, target, now, eff)

    def _pick(self, members: list[Contact], target: int, depth: int,
              slot: int) -> Contact | None:
        capacity, extra = self.slots, 0
        while len(members) > capacity >> extra and capacity >> extra:
            extra += 1                      # overfull: use the half holding the target
            members = [c for c in members
                       if shared_prefix_len(c.node_id, target) >= depth + extra]
        index = slot >> extra
        return members[index] if index < len(members) else None

    def _need(self, op: SampleOp, target: int, now: float, eff: Effects) -> None:
        key = (op.depth, prefix_of(target, op.depth))
        if key in op.known or key in op.pending:
            return
        cached = self.cache.members(target, op.depth, now)
        if cached is not None:
            op.known[key] = cached
            return
        op.pending.add(key)

        def ready(members: list[Contact], when: float, eff: Effects) -> None:
            op.pending.discard(key)
            op.known[key] = members
            if op.finished:
                return
            if op.beta is None:
                self._try_enumerated(op, when, eff)
            else:
                self._advance(op, when, eff)

        self._discover(op, KadId(target), op.depth, now, eff, ready)

    def _try_enumerated(self, op: SampleOp, now: float, eff: Effects) -> None:
        if op.pending or op.busy or op.finished:
            return
        for members in op.known.values():
            for contact in members:
                if contact.node_id != self.own_id:
                    op.chosen.setdefault(contact.node_id, contact)
        self._end(op, now, eff)

    def _end(self, op: SampleOp, now: float, eff: Effects) -> None:
        if not op.finished:
            op.finished = True
            op.on_done(op, now, eff)

    # ------------------------------------------------------------------ discovery
    def _discover(self, op: SampleOp, target: KadId, depth: int, now: float, eff: Effects,
                  done: Ready) -> None:
        """Find every member of ``target``'s depth-``depth`` subtree (several lookups when it
        holds k or more), cache it, then call ``done(members, now, eff)``."""
        key = (depth, prefix_of(target, depth))
        waiters = self._waiting.get(key)
        if waiters is not None:             # another op is discovering it already
            waiters.append(done)
            return
        self._waiting[key] = [done]

        def found(members: list[Contact], when: float, eff: Effects) -> None:
            if self.cache_ttl_s > 0:
                self.cache.put(target, depth, members, when + self.cache_ttl_s)
            for callback in self._waiting.pop(key, []):
                callback(members, when, eff)

        self._collect(op, target, depth, now, eff, found)

    def _collect(self, op: SampleOp, target: KadId, depth: int, now: float, eff: Effects,
                 done: Ready) -> None:
        def on_result(closest: list[Contact], rpcs: int, when: float, eff: Effects) -> None:
            op.rpcs += rpcs
            inside = [c for c in closest if shared_prefix_len(c.node_id, target) >= depth]
            if len(closest) < self.ksize or len(inside) < len(closest) or depth >= ID_BITS:
                done(inside, when, eff)     # the lookup reached past the subtree: all of it
                return
            halves: list[list[Contact]] = []

            def half_done(members: list[Contact], at: float, eff: Effects) -> None:
                halves.append(members)
                if len(halves) == 2:
                    done(halves[0] + halves[1], at, eff)

            shift = ID_BITS - depth - 1
            for bit in (0, 1):
                half = KadId((prefix_of(target, depth) << 1 | bit) << shift)
                self._collect(op, in_subtree(half, depth + 1, op.rng), depth + 1, when, eff,
                              half_done)

        self._lookup(target, now, eff, on_result)

"""The routing table: k-buckets in least-recently-seen order, with replacement caches.

Pure data structure (STYLE 2.8): it never pings anyone. When a full bucket cannot split,
``observe`` returns the bucket's least-recently-seen contact and the caller decides whether to
PING it; the caller then reports ``observe(old)`` (it answered, so it stays) or
``remove(old)`` (it failed, so the newest replacement takes its place). Paper section 2.2/2.4.
"""
from __future__ import annotations

import bisect
import heapq
import logging
from collections import OrderedDict
from dataclasses import dataclass

from actorpy.errors import ProtocolError

from .ids import ID_SPACE, KadId, shared_prefix_len

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Contact:
    """A peer as the overlay knows it: its id and the address a shell can send to."""

    node_id: KadId
    address: str


class KBucket:
    """Contacts whose ids lie in ``[lo, hi)``; ``contacts`` is oldest-seen first."""

    __slots__ = ("lo", "hi", "contacts", "replacements", "last_touched_s")

    def __init__(self, lo: int, hi: int, now: float) -> None:
        self.lo = lo
        self.hi = hi
        self.contacts: OrderedDict[int, Contact] = OrderedDict()
        self.replacements: OrderedDict[int, Contact] = OrderedDict()
        self.last_touched_s = now

    def covers(self, node_id: int) -> bool:
        return self.lo <= node_id < self.hi

    def depth(self) -> int:
        """Bits fixed by this bucket's range (0 for the whole space)."""
        return 160 - (self.hi - self.lo).bit_length() + 1


#: the most targets ``nearest`` remembers (it forgets them all when full)
MAX_NEAREST = 1024


class RoutingTable:
    """k-buckets over the 160-bit space, split by the paper's rule (only the bucket that covers
    our own id splits).

    Args:
        own_id: this node's id (never stored in the table).
        ksize: bucket capacity *k* (paper: 20).
        now: creation time, for bucket refresh bookkeeping.
        replacement_size: capacity of each bucket's replacement cache (default ``ksize``).

    >>> t = RoutingTable(own_id=KadId(0), ksize=2)
    >>> [t.observe(Contact(KadId(i << 150), f"n{i}"), now=0.0) for i in (1, 2, 3)]
    [None, None, None]
    >>> [c.address for c in t.closest(KadId(3 << 150), 2)]
    ['n3', 'n2']
    """

    def __init__(self, own_id: KadId, ksize: int = 20, now: float = 0.0,
                 replacement_size: int | None = None) -> None:
        if ksize < 1:
            raise ValueError("ksize must be >= 1")
        self.own_id = own_id
        self.ksize = ksize
        self.replacement_size = ksize if replacement_size is None else replacement_size
        self._buckets: list[KBucket] = [KBucket(0, ID_SPACE, now)]
        self._los: list[int] = [0]
        self._all: dict[int, Contact] = {}
        # One id per address: a single peer must not fill the table (and skew the size
        # estimate and peer samples) by claiming many ids.
        self._by_address: dict[str, int] = {}
        #: bumped whenever the set of contacts changes (what depends on it may be cached)
        self.version = 0
        self._nearest: dict[int, Contact | None] = {}   # target -> ``nearest``, at version
        self._nearest_at = 0

    # ----------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self._all)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._all

    def get(self, node_id: int) -> Contact | None:
        """The contact with this id, if the table holds it."""
        return self._all.get(node_id)

    def id_at(self, address: str) -> int | None:
        """The id the table holds for ``address``, if any."""
        return self._by_address.get(address)

    def contacts(self) -> list[Contact]:
        """Every contact held (not the replacement caches)."""
        return list(self._all.values())

    @property
    def buckets(self) -> tuple[KBucket, ...]:
        """The buckets, in id order; they partition ``[0, 2**160)``."""
        return tuple(self._buckets)

    def bucket_for(self, node_id: int) -> KBucket:
        """The bucket whose range covers ``node_id``."""
        return self._buckets[bisect.bisect_right(self._los, node_id) - 1]

    def closest(self, target: int, n: int, exclude: frozenset[int] = frozenset()) -> list[Contact]:
        """The ``n`` held contacts closest to ``target`` by XOR, closest first.

        Always equal to a brute-force sort of every contact (ids are distinct, so XOR distances
        are too); never empty while the table holds a contact not in ``exclude``.
        """
        ids = heapq.nsmallest(n + len(exclude), self._all, key=lambda i: i ^ target)
        return [self._all[i] for i in ids if i not in exclude][:n]

    def nearest(self, target: int) -> Contact | None:
        """The held contact closest to ``target`` (``closest(target, 1)``), remembered until
        the contacts change (a key's owner asks it for every push it serves or sends).

        >>> table = RoutingTable(KadId(0), ksize=2)
        >>> table.observe(Contact(KadId(6), "a"), now=0.0)
        >>> table.nearest(7).address, table.observe(Contact(KadId(7), "b"), 0.0)
        ('a', None)
        >>> table.nearest(7).address
        'b'
        """
        if self._nearest_at != self.version or len(self._nearest) >= MAX_NEAREST:
            self._nearest, self._nearest_at = {}, self.version
        if target not in self._nearest:
            closest = self.closest(target, 1)
            self._nearest[target] = closest[0] if closest else None
        return self._nearest[target]

    def level_counts(self) -> dict[int, int]:
        """Number of contacts per shared-prefix length with our own id."""
        counts: dict[int, int] = {}
        for node_id in self._all:
            level = shared_prefix_len(self.own_id, node_id)
            counts[level] = counts.get(level, 0) + 1
        return counts

    def stale_buckets(self, now: float, interval_s: float) -> list[KBucket]:
        """Buckets with no lookup or contact activity for ``interval_s`` (paper 2.3 refresh)."""
        return [b for b in self._buckets if now - b.last_touched_s >= interval_s]

    def touch(self, target: int, now: float) -> None:
        """Note a lookup in the range of ``target``'s bucket (it counts as a refresh)."""
        self.bucket_for(target).last_touched_s = now

    # ----------------------------------------------------------------- updates
    def observe(self, contact: Contact, now: float) -> Contact | None:
        """Note that ``contact`` was just seen alive.

        Returns:
            None when the contact is now in the table (added, or moved to the
            most-recently-seen end), or the bucket's least-recently-seen contact when the
            bucket is full and cannot split: the caller should PING that one. The newcomer
            waits in the replacement cache meanwhile.

        Raises:
            ProtocolError: the contact claims our own id, an id held under another address,
                or a second id for an address the table already holds under another id.
        """
        node_id = contact.node_id
        if node_id == self.own_id:
            raise ProtocolError("a peer claims our own id")
        known = self._all.get(node_id)
        if known is not None and known.address != contact.address:
            raise ProtocolError(f"id held by {known.address} claimed by {contact.address}")
        holder = self._by_address.get(contact.address)
        if holder is not None and holder != node_id:
            raise ProtocolError(f"{contact.address} already holds another id in this table")
        while True:
            bucket = self.bucket_for(node_id)
            bucket.last_touched_s = now
            if known is not None:
                bucket.contacts.move_to_end(node_id)
                return None
            if len(bucket.contacts) < self.ksize:
                bucket.contacts[node_id] = contact
                bucket.replacements.pop(node_id, None)
                self._all[node_id] = contact
                self._by_address[contact.address] = node_id
                self.version += 1
                return None
            if bucket.covers(self.own_id) and bucket.hi - bucket.lo > 1:
                self._split(bucket, now)
                continue
            bucket.replacements.pop(node_id, None)
            bucket.replacements[node_id] = contact
            while len(bucket.replacements) > self.replacement_size:
                bucket.replacements.popitem(last=False)
            return next(iter(bucket.contacts.values()))

    def remove(self, node_id: int) -> Contact | None:
        """Drop a contact that failed to answer (a PING or any RPC).

        Returns:
            The replacement promoted into its place (the most recently seen one), if any.
        """
        bucket = self.bucket_for(node_id)
        bucket.replacements.pop(node_id, None)
        if bucket.contacts.pop(node_id, None) is None:
            return None
        gone = self._all.pop(node_id)
        self._by_address.pop(gone.address, None)
        self.version += 1
        while bucket.replacements:
            new_id, new = bucket.replacements.popitem(last=True)
            if new.address in self._by_address:
                continue  # its address is in the table under another id by now
            bucket.contacts[new_id] = new
            self._all[new_id] = new
            self._by_address[new.address] = new_id
            log.debug("promoted %s from the replacement cache", new.address)
            return new
        return None

    def _split(self, bucket: KBucket, now: float) -> None:
        mid = (bucket.lo + bucket.hi) // 2
        low, high = KBucket(bucket.lo, mid, now), KBucket(mid, bucket.hi, now)
        low.last_touched_s = high.last_touched_s = bucket.last_touched_s
        for source, attr in ((bucket.contacts, "contacts"), (bucket.replacements, "replacements")):
            for node_id, contact in source.items():
                getattr(low if node_id < mid else high, attr)[node_id] = contact
        index = self._buckets.index(bucket)
        self._buckets[index:index + 1] = [low, high]
        self._los[index:index + 1] = [low.lo, high.lo]

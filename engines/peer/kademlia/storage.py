"""Key/value storage with versions, TTL expiry and republish bookkeeping (paper section 2.5).

Pure: every call takes ``now`` (virtual or monotonic seconds from the caller's Clock), so no
wall clock hides in here (bmuller/kademlia's ForgetfulStorage reads ``time.monotonic``).
Each value has a version ``(clock, writer)``; a store keeps the highest it has seen, so
replicas that receive updates in any order converge.

>>> s = MemoryStorage()
>>> s.put(KadId(1), Blob.of(b"v2"), now=0.0, ttl_s=10.0, clock=2)
True
>>> s.put(KadId(1), Blob.of(b"v1"), now=1.0, ttl_s=10.0, clock=1)   # older: ignored
False
>>> s.get(KadId(1), now=9.0).value.to_value(), s.get(KadId(1), now=10.0)
(b'v2', None)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .ids import KadId
from .values import Blob


@dataclass
class Record:
    """A stored value.

    Attributes:
        value: the value stored.
        expires_at: when it stops being served (caller's clock).
        stored_at: when a STORE for it last arrived (or it was last republished from here).
        is_origin: True on the node whose user called ``set``; only the origin renews the TTL.
        clock: the value's version counter (its writer bumps it).
        writer: the id of the node that wrote this version (breaks ties between clocks).
    """

    value: Blob
    expires_at: float
    stored_at: float
    is_origin: bool = False
    clock: int = 0
    writer: KadId = KadId(0)

    @property
    def version(self) -> tuple[int, int]:
        """``(clock, writer)``: what replicas compare."""
        return (self.clock, self.writer)


class Storage(Protocol):
    """What a node needs from its store; swap in a disk-backed one without protocol changes."""

    def put(self, key: KadId, value: Blob, now: float, ttl_s: float, is_origin: bool = False,
            clock: int = 0, writer: KadId = KadId(0)) -> bool: ...

    def get(self, key: KadId, now: float) -> Record | None: ...

    def record(self, key: KadId) -> Record | None: ...

    def expire(self, now: float) -> list[KadId]: ...

    def due_for_republish(self, now: float, interval_s: float) -> list[tuple[KadId, Record]]: ...

    def keys(self) -> list[KadId]: ...

    def drop(self, key: KadId) -> None: ...


class MemoryStorage:
    """An in-memory ``Storage``."""

    def __init__(self) -> None:
        self._records: dict[KadId, Record] = {}

    def __len__(self) -> int:
        return len(self._records)

    def put(self, key: KadId, value: Blob, now: float, ttl_s: float, is_origin: bool = False,
            clock: int = 0, writer: KadId = KadId(0)) -> bool:
        """Store ``value`` unless a live record holds a higher version; the same version only
        refreshes the record. The expiry never moves earlier, origin status is sticky.

        Returns:
            False when a higher version was kept (nothing changed).
        """
        old = self._records.get(key)
        expires_at = now + ttl_s
        if old is not None and now < old.expires_at:
            if (clock, writer) < old.version:
                return False
            is_origin = is_origin or old.is_origin
            expires_at = max(expires_at, old.expires_at)
            if (clock, writer) == old.version:
                value = old.value
        self._records[key] = Record(value, expires_at, now, is_origin, clock, writer)
        return True

    def get(self, key: KadId, now: float) -> Record | None:
        """The live record under ``key``; an expired one is dropped and None returned."""
        record = self._records.get(key)
        if record is None:
            return None
        if now >= record.expires_at:
            del self._records[key]
            return None
        return record

    def drop(self, key: KadId) -> None:
        """Forget ``key`` (a node that handed it on when leaving)."""
        self._records.pop(key, None)

    def record(self, key: KadId) -> Record | None:
        """The record under ``key`` (expired or not), for inspection."""
        return self._records.get(key)

    def expire(self, now: float) -> list[KadId]:
        """Drop every expired record; returns the dropped keys."""
        gone = [k for k, r in self._records.items() if now >= r.expires_at]
        for key in gone:
            del self._records[key]
        return gone

    def due_for_republish(self, now: float, interval_s: float) -> list[tuple[KadId, Record]]:
        """Live records to republish now. A holder skips a key that a STORE refreshed within the
        interval (someone else republished it, paper 2.5); the origin always republishes."""
        return [(k, r) for k, r in self._records.items()
                if now < r.expires_at and (r.is_origin or now - r.stored_at >= interval_s)]

    def keys(self) -> list[KadId]:
        """Every key held, expired or not."""
        return list(self._records)

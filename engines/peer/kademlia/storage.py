"""Key/value storage with TTL expiry and republish bookkeeping (paper section 2.5).

Pure: every call takes ``now`` (virtual or monotonic seconds from the caller's Clock), so no
wall clock hides in here (bmuller/kademlia's ForgetfulStorage reads ``time.monotonic``).

>>> s = MemoryStorage()
>>> s.put(KadId(1), b"v", now=0.0, ttl_s=10.0)
>>> s.get(KadId(1), now=9.0), s.get(KadId(1), now=10.0)
(b'v', None)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .ids import KadId


@dataclass
class Record:
    """A stored value.

    Attributes:
        value: the bytes stored.
        expires_at: when it stops being served (caller's clock).
        stored_at: when a STORE for it last arrived (or it was last republished from here).
        is_origin: True on the node whose user called ``set``; only the origin renews the TTL.
    """

    value: bytes
    expires_at: float
    stored_at: float
    is_origin: bool = False


class Storage(Protocol):
    """What a node needs from its store; swap in a disk-backed one without protocol changes."""

    def put(self, key: KadId, value: bytes, now: float, ttl_s: float,
            is_origin: bool = False) -> None: ...

    def get(self, key: KadId, now: float) -> bytes | None: ...

    def record(self, key: KadId) -> Record | None: ...

    def expire(self, now: float) -> list[KadId]: ...

    def due_for_republish(self, now: float, interval_s: float) -> list[tuple[KadId, Record]]: ...

    def keys(self) -> list[KadId]: ...


class MemoryStorage:
    """An in-memory ``Storage``."""

    def __init__(self) -> None:
        self._records: dict[KadId, Record] = {}

    def __len__(self) -> int:
        return len(self._records)

    def put(self, key: KadId, value: bytes, now: float, ttl_s: float,
            is_origin: bool = False) -> None:
        """Store or refresh ``key``; the expiry never moves earlier, origin status is sticky."""
        old = self._records.get(key)
        expires_at = now + ttl_s
        if old is not None:
            is_origin = is_origin or old.is_origin
            if old.value == value:
                expires_at = max(expires_at, old.expires_at)
        self._records[key] = Record(value, expires_at, now, is_origin)

    def get(self, key: KadId, now: float) -> bytes | None:
        """The live value under ``key``; an expired one is dropped and None returned."""
        record = self._records.get(key)
        if record is None:
            return None
        if now >= record.expires_at:
            del self._records[key]
            return None
        return record.value

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

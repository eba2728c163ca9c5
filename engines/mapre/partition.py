"""Stable partitioning: which reduce partition a key goes to, the same in every process.

Python's ``hash()`` of a str changes per process (``PYTHONHASHSEED``), so it cannot place a
key consistently across workers. Keys are hashed here with CRC-32 of their UTF-8 bytes (str),
CRC-32 (bytes), the value itself (int), and a fixed combination of those for tuples. Keys
that compare equal in Python hash alike: ``1``, ``1.0``, ``True``, ``Decimal("1")``,
``Fraction(1)`` and ``1+0j`` go to one partition, as a dict would merge them. Other keys
fall back to BLAKE2b of their pickle, which is stable for plain data (dataclasses, enums)
but not for keys whose pickle depends on a set's order.

Hot paths hash lists of keys through ``map`` over C functions, so bucketing a partition
costs a few C calls per key rather than a Python frame.
"""
from __future__ import annotations

import bisect
import hashlib
import numbers
import pickle
import struct
from decimal import Decimal
from itertools import compress
from operator import itemgetter
from typing import Any, Callable, Hashable, Iterable, Sequence
from zlib import crc32

_MASK = (1 << 64) - 1
#: Up to this many partitions, bucketing makes one ``compress`` pass (in C) per partition.
_COMPRESS_MAX = 16
_first = itemgetter(0)


def stable_hash(key: Hashable) -> int:
    """A non-negative hash of ``key`` that is the same in every process and on every run.

    >>> stable_hash("word") == stable_hash("word") and stable_hash(1) == stable_hash(1.0)
    True
    >>> stable_hash(("a", 2)) == stable_hash(("a", 2.0))
    True
    """
    kind = type(key)
    if kind is str:
        return crc32(key.encode("utf-8", "surrogatepass"))  # type: ignore[union-attr]
    if kind is int:
        return key & _MASK  # type: ignore[operator]
    if kind is bytes:
        return crc32(key)  # type: ignore[arg-type]
    if isinstance(key, tuple):  # namedtuples compare equal to tuples, so hash alike
        h = 0x345678 ^ len(key)
        for part in key:
            h = ((h * 1000003) ^ stable_hash(part)) & _MASK
        return h
    if key is None:
        return 0
    if isinstance(key, str):
        return crc32(str(key).encode("utf-8", "surrogatepass"))
    if isinstance(key, numbers.Integral):  # bool, numpy integers
        return int(key) & _MASK
    if isinstance(key, (numbers.Real, Decimal)):
        return _real_hash(key)
    if isinstance(key, numbers.Complex):   # 1+0j == 1: a complex on the real axis is a real
        if key.imag == 0:
            return _real_hash(key.real)
        return crc32(struct.pack("<dd", key.real, key.imag))
    if isinstance(key, (bytes, bytearray, memoryview)):
        return crc32(bytes(key))
    if isinstance(key, frozenset):  # order-free: combine by xor of the members' hashes
        h = 0x9E3779B97F4A7C15
        for part in key:
            h ^= (stable_hash(part) * 0x100000001B3) & _MASK
        return h
    digest = hashlib.blake2b(pickle.dumps(key, protocol=5), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _real_hash(key: Any) -> int:
    """``stable_hash`` of a real number (a float, Fraction, Decimal, numpy float) that is
    the same for every key equal to it in Python, whatever its type: an integral value
    hashes as the int it equals (computed exactly: a float of Fraction(10**20 + 1) or
    Decimal("12345678901234567891") is another int), any other value as its nearest float
    (a non-integral Decimal or Fraction equal to a float converts to that float)."""
    if isinstance(key, Decimal):   # not a numbers.Real, yet Decimal("2") == 2 == 2.0
        if key.is_finite() and key == key.to_integral_value():
            return int(key) & _MASK
    elif isinstance(key, numbers.Rational) and key.denominator == 1:
        return int(key.numerator) & _MASK
    f = float(key)
    if f.is_integer():
        return int(f) & _MASK
    return crc32(struct.pack("<d", f))


def partition_of(key: Hashable, partitions: int) -> int:
    """The partition in ``range(partitions)`` that ``key`` belongs to.

    >>> partition_of("word", 4) == stable_hash("word") % 4
    True
    """
    return stable_hash(key) % partitions


def _hashes(keys: Iterable[Any]) -> list[int]:
    keys = keys if isinstance(keys, list) else list(keys)
    if set(map(type, keys)) <= {str}:  # the common case, all in C
        try:
            return list(map(crc32, map(str.encode, keys)))
        except UnicodeEncodeError:  # a lone surrogate: stable_hash encodes it with surrogatepass
            pass
    return list(map(stable_hash, keys))


def bucket_by_ids(items: Sequence[Any], ids: list[int], partitions: int) -> list[list[Any]]:
    """Split ``items`` into ``partitions`` lists; item i goes to list ``ids[i]``. Order is kept."""
    if partitions == 1:
        return [list(items)]
    if partitions <= _COMPRESS_MAX:  # one pass in C per partition beats a Python loop
        return [list(compress(items, map(r.__eq__, ids))) for r in range(partitions)]
    buckets: list[list[Any]] = [[] for _ in range(partitions)]
    adds = [b.append for b in buckets]
    for i, item in zip(ids, items):
        adds[i](item)
    return buckets


def bucket_pairs(pairs: Sequence[tuple[Any, Any]], partitions: int) -> list[list[Any]]:
    """Split ``(key, value)`` pairs by ``partition_of(key)``, keeping their order.

    >>> bucket_pairs([("a", 1), ("b", 2), ("a", 3)], 1)
    [[('a', 1), ('b', 2), ('a', 3)]]
    """
    if partitions == 1:
        return [list(pairs)]
    ids = list(map(partitions.__rmod__, _hashes(list(map(_first, pairs)))))
    return bucket_by_ids(pairs, ids, partitions)


def bucket_keys(keys: Sequence[Any], partitions: int) -> list[list[Any]]:
    """Split bare keys (e.g. for ``distinct``) by ``partition_of``, keeping their order."""
    if partitions == 1:
        return [list(keys)]
    ids = list(map(partitions.__rmod__, _hashes(keys)))
    return bucket_by_ids(keys, ids, partitions)


def range_bounds(samples: Iterable[tuple[Any, float]], partitions: int) -> list[Any]:
    """Split points for a range partitioning into ``partitions`` parts of about equal weight.

    Args:
        samples: ``(key, weight)`` pairs; a weight says how many items a sampled key stands for.
        partitions: how many ranges.
    Returns:
        ``partitions - 1`` ascending keys (fewer when there are fewer distinct samples).

    >>> range_bounds([(k, 1.0) for k in range(100)], 4)
    [25, 50, 75]
    """
    ordered = sorted(samples, key=_first)
    total = sum(w for _, w in ordered)
    if partitions <= 1 or not ordered or total <= 0:
        return []
    bounds: list[Any] = []
    step = total / partitions
    target, acc = step, 0.0
    for key, weight in ordered:
        acc += weight
        if acc > target and (not bounds or key > bounds[-1]):
            bounds.append(key)
            target += step
            if len(bounds) == partitions - 1:
                break
    return bounds


def range_ids(keys: Iterable[Any], bounds: list[Any], partitions: int,
              ascending: bool) -> list[int]:
    """The range partition of each key: equal keys always share one, so a sort stays stable.

    >>> range_ids([1, 5, 9], [4, 8], 3, True), range_ids([1, 5, 9], [4, 8], 3, False)
    ([0, 1, 2], [2, 1, 0])
    """
    bisect_right = bisect.bisect_right
    ids = [bisect_right(bounds, k) for k in keys]
    if not ascending:
        top = partitions - 1
        ids = [top - i for i in ids]
    return ids


def key_sampler(keyfn: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """The sort key function (identity when None)."""
    return keyfn if keyfn is not None else _identity


def _identity(x: Any) -> Any:
    return x

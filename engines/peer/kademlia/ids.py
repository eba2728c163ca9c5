"""160-bit Kademlia ids, XOR distance and shared-prefix length (Maymounkov & Mazieres 2002, 2.1).

Ids are plain ``int``s in ``[0, 2**160)`` inside the protocol (XOR on ints is fast) and 20-byte
big-endian strings on the wire.
"""
from __future__ import annotations

import hashlib
import random
from typing import NewType

from actorpy.errors import ProtocolError

KadId = NewType("KadId", int)

ID_BITS = 160
ID_BYTES = ID_BITS // 8
ID_SPACE = 1 << ID_BITS
#: the largest step, clock or stamp a message may carry (a signed 64-bit int)
MAX_STEP = (1 << 63) - 1


def key_id(key: bytes | str) -> KadId:
    """The id of a key: SHA-1 of its bytes (str keys are UTF-8 encoded), as in the paper.

    >>> hex(key_id("w"))[:10]
    '0xaff024fe'
    >>> key_id(b"w") == key_id("w")
    True
    """
    data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    return KadId(int.from_bytes(hashlib.sha1(data).digest(), "big"))


def random_id(rng: random.Random) -> KadId:
    """A uniformly random id drawn from the injected ``rng``.

    >>> random_id(random.Random(1)) == random_id(random.Random(1))
    True
    """
    return KadId(rng.getrandbits(ID_BITS))


def random_id_in_range(lo: int, hi: int, rng: random.Random) -> KadId:
    """A uniformly random id in ``[lo, hi)`` (a bucket's range), for bucket refresh."""
    return KadId(lo + rng.randrange(hi - lo))


def distance(a: int, b: int) -> int:
    """XOR distance between two ids (paper 2.1): symmetric, zero only for ``a == b``.

    >>> distance(0b1100, 0b1010)
    6
    >>> distance(5, 5), distance(3, 9) == distance(9, 3)
    (0, True)
    """
    return a ^ b


def shared_prefix_len(a: int, b: int) -> int:
    """Number of leading bits (of 160) that ``a`` and ``b`` share; 160 when equal.

    >>> shared_prefix_len(0, 1 << 159)
    0
    >>> shared_prefix_len(0, 1)
    159
    """
    return ID_BITS - (a ^ b).bit_length()


def id_to_bytes(node_id: int) -> bytes:
    """Wire form of an id: 20 bytes, big-endian.

    >>> len(id_to_bytes(1))
    20
    """
    return node_id.to_bytes(ID_BYTES, "big")


def id_from_bytes(data: object) -> KadId:
    """Parse a wire id; anything but exactly 20 bytes raises ``ProtocolError``.

    >>> id_from_bytes(id_to_bytes(42))
    42
    >>> id_from_bytes(b"short")
    Traceback (most recent call last):
    ...
    actorpy.errors.ProtocolError: id must be 20 bytes, got 5
    """
    if type(data) is not bytes:
        raise ProtocolError(f"id must be bytes, got {type(data).__name__}")
    if len(data) != ID_BYTES:
        raise ProtocolError(f"id must be {ID_BYTES} bytes, got {len(data)}")
    return KadId(int.from_bytes(data, "big"))


def short(node_id: int) -> str:
    """First 8 hex digits of an id, for logs."""
    return f"{node_id:040x}"[:8]

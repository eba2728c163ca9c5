"""How stored blocks are laid out (pure): the common shapes go column-wise, everything else
as a plain list.

Pickling a list of many small str (or of ``(str, value)`` pairs) spends most of its time
memoizing every string and tuple. A list of str travels instead as one ``"\\x00"``-joined
str, and a list of ``(str, value)`` pairs as the joined keys plus the list of values: one
big string pickles as a single copy, and ``split`` rebuilds the keys in C. Measured here
for 114k ``(word, count)`` pairs: encode 14 -> 8 ms, decode 16 -> 13 ms; for lines of text
the gain is larger. Items containing ``"\\x00"`` keep the plain form.
"""
from __future__ import annotations

from operator import itemgetter
from typing import Any, Iterable, Sequence

_SEP = "\x00"
_first = itemgetter(0)
_second = itemgetter(1)


def pack(items: Sequence[Any]) -> Any:
    """The stored form of ``items`` (a list of at most a few MB).

    >>> pack(["a", "b"]), pack([("a", 1), ("b", 2)]), pack([1, 2])
    (('s', 'a\\x00b'), ('p', 'a\\x00b', [1, 2]), [1, 2])
    """
    items = items if isinstance(items, list) else list(items)
    if len(items) < 2:
        return items
    kinds = set(map(type, items))
    if kinds == {str}:
        joined = _SEP.join(items)
        if joined.count(_SEP) == len(items) - 1:
            return ("s", joined)
    elif kinds == {tuple} and set(map(len, items)) == {2}:
        joined = _joined(list(map(_first, items)))
        if joined is not None:
            return ("p", joined, list(map(_second, items)))
    return items


def pack_columns(keys: list[Any], values: list[Any]) -> Any:
    """The stored form of the pairs ``zip(keys, values)`` given as two lists (a dict's keys
    and values): the same as ``pack(list(zip(keys, values)))``, with no tuple per pair.

    >>> pack_columns(["a", "b"], [1, 2]), pack_columns([1, 2], [3, 4])
    (('p', 'a\\x00b', [1, 2]), [(1, 3), (2, 4)])
    """
    joined = _joined(keys) if len(keys) >= 2 else None
    return list(zip(keys, values)) if joined is None else ("p", joined, values)


def _joined(keys: list[Any]) -> str | None:
    """``keys`` joined by ``"\\x00"``, or None unless all are str without one."""
    if set(map(type, keys)) != {str}:
        return None
    joined = _SEP.join(keys)
    return joined if joined.count(_SEP) == len(keys) - 1 else None


def unpack(block: Any) -> list[Any]:
    """The items of a stored block, as the list that was packed.

    >>> unpack(pack([("a", 1), ("b", 2)])), unpack(pack(["x", "y"]))
    ([('a', 1), ('b', 2)], ['x', 'y'])
    """
    if type(block) is not tuple:
        return block
    if block[0] == "s":
        return block[1].split(_SEP)
    return list(zip(block[1].split(_SEP), block[2]))


def iter_unpacked(block: Any) -> Iterable[Any]:
    """The items of a stored block, for one pass: pairs come from a ``zip``, with no list of
    tuples built (merging 200k ``(word, count)`` pairs into a dict: about 20% faster).

    >>> list(iter_unpacked(pack([("a", 1), ("b", 2)])))
    [('a', 1), ('b', 2)]
    """
    if type(block) is tuple and block[0] == "p":
        return zip(block[1].split(_SEP), block[2])
    return unpack(block)

"""Narrow steps and their fusion: a chain of steps becomes one iterator pipeline per partition.

Each step maps to a builtin (``map``, ``filter``, ``itertools.chain.from_iterable``), so the
pipeline runs in C between the user's own functions: no engine frame per item per step.
"""
from __future__ import annotations

from enum import IntEnum
from itertools import chain
from typing import Any, Callable, Iterable


class Step(IntEnum):
    """The narrow transformations."""

    MAP = 1
    FILTER = 2
    FLAT_MAP = 3
    FLATTEN = 4
    MAP_PARTITIONS = 5


#: One narrow step: its kind and the user's function (None for FLATTEN).
Op = tuple[Step, Callable[..., Any] | None]

_from_iterable = chain.from_iterable
#: A dict's items view: returned by a last map_partitions, it is passed on as the view.
DICT_ITEMS = type({}.items())


def apply_ops(items: Iterable[Any], ops: tuple[Op, ...]) -> Iterable[Any]:
    """Stack ``ops`` onto ``items`` as one lazy iterator (nothing runs until it is consumed;
    a dict's items view returned by a last ``map_partitions`` is passed on as it is).

    >>> list(apply_ops(["a b", "c"], ((Step.FLAT_MAP, str.split), (Step.MAP, str.upper))))
    ['A', 'B', 'C']
    """
    it: Iterable[Any] = items
    for step, fn in ops:
        if step is Step.MAP:
            it = map(fn, it)  # type: ignore[arg-type]
        elif step is Step.FILTER:
            it = filter(fn, it)
        elif step is Step.FLAT_MAP:
            it = _from_iterable(map(fn, it))  # type: ignore[arg-type]
        elif step is Step.FLATTEN:
            it = _from_iterable(it)
        else:
            it = _partition_output(fn(iter(it)), fn)  # type: ignore[misc]
    # A dict's items view (``counts.items()`` from map_partitions) is passed on as the view:
    # a sink that wants pairs by key reads its keys and values as lists (shuffle.py).
    return it if type(it) is DICT_ITEMS else iter(it)


def _partition_output(out: Any, fn: Any) -> Iterable[Any]:
    if out is None or not hasattr(out, "__iter__"):
        raise TypeError(f"the function given to map_partitions ({describe_fn(fn)}) must return "
                        f"an iterable (a list, a generator, ...), not {type(out).__name__}")
    return out


def describe_fn(fn: Any) -> str:
    """A short name for a user function, for stage names and error messages."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def describe_ops(ops: tuple[Op, ...]) -> str:
    """``"flat_map(split) -> map(lower)"``: the fused steps, for messages.

    >>> describe_ops(((Step.FLAT_MAP, str.split), (Step.FLATTEN, None)))
    'flat_map(str.split) -> flatten'
    """
    parts = []
    for step, fn in ops:
        label = step.name.lower()
        parts.append(label if fn is None else f"{label}({describe_fn(fn)})")
    return " -> ".join(parts)

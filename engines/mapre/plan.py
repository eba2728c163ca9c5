"""The logical plan: what a Dataset is, as a tree of nodes (pure: no I/O, no cluster).

Narrow steps fuse while the plan is built: ``map`` on a ``Narrow`` node returns a new
``Narrow`` with one more step, never a chain of nodes, so each partition runs every narrow
step in one pass. ``Shuffle`` nodes cut the plan into stages; ``Cache`` nodes mark where
computed partitions are kept (and where lineage recomputation starts when they are lost).
Nodes compare by identity: a shuffle or cache is the same one however often it is reached.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable, Iterator

from actorpy.ids import NodeId
from engines.mapre.ops import Op, describe_ops


class ShuffleKind(IntEnum):
    """The wide transformations: how map outputs are bucketed and merged."""

    REDUCE_BY_KEY = 1
    GROUP_BY_KEY = 2
    DISTINCT = 3
    SORT_BY = 4
    SHUFFLE = 5
    JOIN = 6
    LEFT_JOIN = 7


@dataclass(frozen=True)
class Split:
    """A byte range of one file: the lines that *start* in ``[start, end)``."""

    path: str
    start: int
    end: int


class Node:
    """Base of plan nodes. ``partitions`` is fixed when the node is built."""

    partitions: int

    def children(self) -> tuple[Node, ...]:
        return ()

    def label(self) -> str:
        return type(self).__name__.lower()


@dataclass(eq=False)
class TextSource(Node):
    """Lines of text files (or, with ``raw``, blocks of whole lines): a partition reads
    its splits one after the other (several when files are small, io.pack_splits)."""

    splits: tuple[tuple[Split, ...], ...]
    errors: str
    where: str
    raw: bool = False
    cut_long_lines: bool = False

    def __post_init__(self) -> None:
        self.partitions = len(self.splits)

    def label(self) -> str:
        return f"load({self.where})"


@dataclass(eq=False)
class ItemsSource(Node):
    """Items from the driver, already cut into partitions."""

    chunks: tuple[list[Any], ...]

    def __post_init__(self) -> None:
        self.partitions = len(self.chunks)

    def label(self) -> str:
        return "from_items"


@dataclass(eq=False)
class Narrow(Node):
    """``parent`` with fused narrow steps applied to each of its partitions."""

    parent: Node
    ops: tuple[Op, ...]

    def __post_init__(self) -> None:
        self.partitions = self.parent.partitions

    def children(self) -> tuple[Node, ...]:
        return (self.parent,)

    def label(self) -> str:
        return describe_ops(self.ops)


@dataclass(eq=False)
class Union(Node):
    """The partitions of each parent, one after another."""

    parents: tuple[Node, ...]

    def __post_init__(self) -> None:
        self.partitions = sum(p.partitions for p in self.parents)

    def children(self) -> tuple[Node, ...]:
        return self.parents

    def locate(self, part: int) -> tuple[Node, int]:
        """Which parent partition is partition ``part`` of the union."""
        for parent in self.parents:
            if part < parent.partitions:
                return parent, part
            part -= parent.partitions
        raise IndexError(part)


@dataclass(eq=False)
class Shuffle(Node):
    """A wide step: every output partition reads a bucket of every parent partition.

    Attributes:
        fn: the ``op`` of reduce_by_key, or the key function of sort_by (else None).
        ascending: sort order (sort_by only).
    """

    parents: tuple[Node, ...]
    kind: ShuffleKind
    partitions: int
    fn: Callable[..., Any] | None = None
    ascending: bool = True

    def children(self) -> tuple[Node, ...]:
        return self.parents

    def label(self) -> str:
        return self.kind.name.lower()


_cache_ids = itertools.count(1)


@dataclass(eq=False)
class Cache(Node):
    """``parent``'s partitions, kept in the workers' stores once computed.

    ``locations`` says which worker holds each computed partition (and in how many stored
    chunks); the scheduler drops entries for lost workers, and those partitions are
    recomputed from ``parent``. ``job_scoped`` caches belong to one job (the sample pass of
    sort_by), are read once, and are never stored by a recomputation.
    """

    parent: Node
    key_prefix: str
    job_scoped: bool = False
    disabled: bool = False  # after unpersist(): computed through, never stored again
    locations: dict[int, tuple[NodeId, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.partitions = self.parent.partitions

    def children(self) -> tuple[Node, ...]:
        return (self.parent,)

    def label(self) -> str:
        return "cache"

    def key(self, part: int) -> str:
        return f"{self.key_prefix}/{part}"

    def where(self, part: int) -> tuple[NodeId, int] | None:
        """(holder, chunks) of a computed partition, or None."""
        with self.lock:
            return self.locations.get(part)

    def record(self, part: int, node: NodeId, chunks: int) -> None:
        with self.lock:
            self.locations[part] = (node, chunks)

    def drop(self, part: int) -> None:
        with self.lock:
            self.locations.pop(part, None)

    def forget(self, dead: set[NodeId]) -> None:
        """Drop the partitions held by ``dead`` workers."""
        with self.lock:
            for part in [p for p, (n, _) in self.locations.items() if n in dead]:
                del self.locations[part]

    def holders(self) -> set[NodeId]:
        with self.lock:
            return {n for n, _ in self.locations.values()}

    def clear(self) -> None:
        with self.lock:
            self.locations.clear()

    def is_complete(self) -> bool:
        with self.lock:
            return not self.disabled and len(self.locations) == self.partitions


def narrow(node: Node, op: Op) -> Narrow:
    """``node`` with one more narrow step, fused into the existing chain when there is one."""
    if isinstance(node, Narrow):
        return Narrow(node.parent, node.ops + (op,))
    return Narrow(node, (op,))


def new_cache_prefix(owner: str) -> str:
    """Store keys for a new cache: ``mapre/cache/<owner>-<n>``."""
    return f"mapre/cache/{owner}-{next(_cache_ids)}"


def input_shuffles(node: Node) -> Iterator[Shuffle]:
    """The shuffles whose map outputs computing ``node``'s partitions reads now: down to
    the first Shuffle on each path, and through a Cache only while it has missing partitions."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, Shuffle):
            yield current
        elif isinstance(current, Cache) and current.is_complete():
            continue
        else:
            stack.extend(current.children())


def lineage(node: Node) -> str:
    """``"load(x.txt) -> flat_map(str.split) -> reduce_by_key"``: the narrow path into a
    stage, for stage names (a union or join shows its first input)."""
    parts: list[str] = []
    current: Node | None = node
    while current is not None:
        parts.append(current.label())
        if isinstance(current, Shuffle) and current is not node:
            break
        kids = current.children()
        current = kids[0] if kids else None
    return " -> ".join(reversed(parts))


def count_stages(node: Node) -> int:
    """How many stages running ``node`` takes now (shuffles not behind a complete cache,
    plus the sample passes of sorts, plus the final stage)."""
    seen: set[int] = set()
    total = 1

    def visit(n: Node) -> None:
        nonlocal total
        for s in input_shuffles(n):
            if id(s) not in seen:
                seen.add(id(s))
                total += 2 if s.kind is ShuffleKind.SORT_BY else 1
                for parent in s.parents:
                    visit(parent)
    visit(node)
    return total


def shuffle_readers(final: Node, result: int) -> dict[int, set[int]]:
    """For each shuffle (by ``id``), the stages that read its blocks: ``id(shuffle)`` of a
    map stage that reads it, or ``result`` for the action's own stage."""
    readers: dict[int, set[int]] = {}
    for shuffle in input_shuffles(final):
        readers.setdefault(id(shuffle), set()).add(result)
    for node in walk(final):
        if isinstance(node, Shuffle):
            for parent in node.parents:
                for shuffle in input_shuffles(parent):
                    readers.setdefault(id(shuffle), set()).add(id(node))
    return readers


def unique_shuffles(shuffles: Iterator[Shuffle]) -> list[Shuffle]:
    """``shuffles`` without repeats (by identity), in first-seen order."""
    seen: dict[int, Shuffle] = {}
    for s in shuffles:
        seen.setdefault(id(s), s)
    return list(seen.values())


def walk(node: Node) -> Iterator[Node]:
    """Every node reachable from ``node`` (itself included), each once."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if id(current) not in seen:
            seen.add(id(current))
            yield current
            stack.extend(current.children())

"""``Dataset[T]``: an immutable, lazy, distributed collection.

Transformations return a new Dataset and do no work; actions (``collect``, ``count``,
``reduce``, ``fold``, ``take``, ``top``, ``save``, ``reduce_by_key_locally``) run the plan on
the cluster and take a ``timeout_s``. User functions must be picklable and deterministic: a
lost partition is recomputed by running them again.
"""
from __future__ import annotations

import numbers
import os
import weakref
from operator import index, itemgetter
from typing import Any, Callable, Generic, Hashable, Iterable, Iterator, TypeVar

from actorpy.errors import ConfigError
from engines.mapre import actions
from engines.mapre import plan as P
from engines.mapre.engine import Engine, release_cache
from engines.mapre.errors import ArgumentError, MapreError, check_timeout
from engines.mapre.ops import Step

T = TypeVar("T")
U = TypeVar("U")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
W = TypeVar("W")

#: Default time limit of an action, in seconds.
DEFAULT_TIMEOUT_S = 600.0


def _check_fn(fn: Any, what: str) -> None:
    if not callable(fn):
        raise ArgumentError(f"{what} needs a function, got {type(fn).__name__}")


#: The most partitions a dataset may have: each is a task (and a bucket of every map task
#: before a shuffle). ``from_items(partitions=10**9)`` built 10**9 lists in the driver: 13 GB
#: and still going past its action's timeout.
MAX_PARTITIONS = 1 << 16


def _count(n: Any, what: str) -> int:
    """``n`` of ``take(n)`` / ``top(n)``: an int >= 0 (numpy's too). A str, a float or a
    negative number was taken through ``int()`` or as no items."""
    try:
        count = index(n)
    except TypeError:
        count = -1
    if isinstance(n, bool) or count < 0:
        raise ArgumentError(f"{what}: n must be an integer >= 0, got {n!r}")
    return count


def _check_partitions(n: int | None, what: str) -> int | None:
    """``partitions``, checked, as a plain int (a numpy one too) or None."""
    if n is None:
        return None
    if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"{what}: partitions must be an integer >= 1, got {n!r}")
    if n > MAX_PARTITIONS:
        raise ConfigError(f"{what}: partitions={n} is more than {MAX_PARTITIONS}: each "
                          "partition is a task; a few per worker keep them all busy")
    return int(n)


class Dataset(Generic[T]):
    """A lazy dataset of items of type ``T`` on a cluster (make one with ``mapre.load``
    or ``mapre.from_items``)."""

    __slots__ = ("_engine", "_node")

    def __init__(self, engine: Engine, node: P.Node) -> None:
        self._engine = engine
        self._node = node

    @property
    def partitions(self) -> int:
        """How many partitions (parallel pieces) the dataset has."""
        return self._node.partitions

    @property
    def cluster(self) -> Any:
        """The cluster this dataset runs on."""
        return self._engine.cluster

    def __repr__(self) -> str:
        return f"<Dataset {self.partitions} partitions: {P.lineage(self._node)}>"

    def _then(self, node: P.Node) -> Dataset[Any]:
        return Dataset(self._engine, node)

    def _step(self, step: Step, fn: Any, what: str) -> Dataset[Any]:
        if step is not Step.FLATTEN:
            _check_fn(fn, what)
        return self._then(P.narrow(self._node, (step, fn)))

    def _same_cluster(self, other: Any, what: str) -> Dataset[Any]:
        if not isinstance(other, Dataset):
            raise ArgumentError(f"{what} needs a Dataset, got {type(other).__name__}")
        if other._engine is not self._engine:
            raise MapreError(f"{what}: both datasets must belong to the same cluster")
        return other

    # ------------------------------------------------------------ narrow
    def map(self, fn: Callable[[T], U]) -> Dataset[U]:
        """``fn(x)`` for every item.

        Example::

            mapre.from_items(cluster, [1, 2, 3]).map(lambda x: x * 10)   # 10, 20, 30
        """
        return self._step(Step.MAP, fn, "map")

    def flat_map(self, fn: Callable[[T], Iterable[U]]) -> Dataset[U]:
        """Every item of ``fn(x)`` for every item (``fn`` returns an iterable).

        Example::

            lines.flat_map(str.split)        # "a b", "c" -> "a", "b", "c"
        """
        return self._step(Step.FLAT_MAP, fn, "flat_map")

    def filter(self, predicate: Callable[[T], Any]) -> Dataset[T]:
        """The items for which ``predicate(x)`` is true.

        Example::

            numbers.filter(lambda x: x % 2 == 0)
        """
        return self._step(Step.FILTER, predicate, "filter")

    def map_partitions(self, fn: Callable[[Iterator[T]], Iterable[U]]) -> Dataset[U]:
        """``fn(iterator over one partition)`` per partition; it returns the new items.

        Example::

            lines.map_partitions(lambda it: [sum(1 for _ in it)])   # items per partition
        """
        return self._step(Step.MAP_PARTITIONS, fn, "map_partitions")

    def flatten(self) -> Dataset[Any]:
        """The items of each item (each item must be iterable).

        Example::

            mapre.from_items(cluster, [[1, 2], [3]]).flatten()      # 1, 2, 3
        """
        return self._step(Step.FLATTEN, None, "flatten")

    def map_values(self: Dataset[tuple[K, V]], fn: Callable[[V], W]) -> Dataset[tuple[K, W]]:
        """``(k, fn(v))`` for every pair ``(k, v)``.

        Example::

            pairs.map_values(len)            # ("a", [1, 2]) -> ("a", 2)
        """
        _check_fn(fn, "map_values")
        return self.map(lambda kv: (kv[0], fn(kv[1])))

    def keys(self: Dataset[tuple[K, V]]) -> Dataset[K]:
        """The first element of every pair.

        Example::

            counts.keys()                    # ("a", 3) -> "a"
        """
        return self.map(_first)

    def values(self: Dataset[tuple[K, V]]) -> Dataset[V]:
        """The second element of every pair.

        Example::

            counts.values().fold(0, operator.add)                     # total count
        """
        return self.map(_second)

    def union(self, *others: Dataset[T]) -> Dataset[T]:
        """This dataset's items, then each other's (partitions side by side, no shuffle).

        Example::

            a.union(b).count() == a.count() + b.count()
        """
        parents = [self._node, *(self._same_cluster(o, "union")._node for o in others)]
        return self._then(P.Union(tuple(parents)))

    # ------------------------------------------------------------ wide
    def _shuffle(self, kind: P.ShuffleKind, partitions: int | None, what: str,
                 parents: tuple[P.Node, ...] | None = None, fn: Any = None,
                 ascending: bool = True) -> Dataset[Any]:
        partitions = _check_partitions(partitions, what)
        parents = parents or (self._node,)
        n = partitions or max(1, max(p.partitions for p in parents))
        return self._then(P.Shuffle(parents, kind, n, fn, ascending))

    def reduce_by_key(self: Dataset[tuple[K, V]], op: Callable[[V, V], V],
                      partitions: int | None = None) -> Dataset[tuple[K, V]]:
        """Pairs ``(k, v)`` -> one pair per key, its values combined with ``op`` (which
        must be associative and commutative). Values are combined on each worker before
        they are shuffled.

        Example::

            words.map(lambda w: (w, 1)).reduce_by_key(operator.add)   # word counts
        """
        _check_fn(op, "reduce_by_key")
        return self._shuffle(P.ShuffleKind.REDUCE_BY_KEY, partitions, "reduce_by_key", fn=op)

    def group_by_key(self: Dataset[tuple[K, V]],
                     partitions: int | None = None) -> Dataset[tuple[K, list[V]]]:
        """Pairs ``(k, v)`` -> ``(k, [v, ...])`` per key (values in input order).

        Example::

            pairs.group_by_key()             # ("a", 1), ("a", 2) -> ("a", [1, 2])
        """
        return self._shuffle(P.ShuffleKind.GROUP_BY_KEY, partitions, "group_by_key")

    def distinct(self, partitions: int | None = None) -> Dataset[T]:
        """Each distinct item once (items must be hashable).

        Example::

            mapre.from_items(cluster, [1, 1, 2]).distinct()           # 1, 2
        """
        return self._shuffle(P.ShuffleKind.DISTINCT, partitions, "distinct")

    def sort_by(self, key: Callable[[T], Any] | None = None, ascending: bool = True,
                partitions: int | None = None) -> Dataset[T]:
        """The items sorted by ``key(x)`` (the items themselves when None); stable, like
        ``sorted``. Keys are sampled first to cut the range into even partitions.

        Example::

            pairs.sort_by(lambda kv: kv[1], ascending=False).take(10)
        """
        if key is not None:
            _check_fn(key, "sort_by")
        source = P.Cache(self._node, "", job_scoped=True)  # sampled, then shuffled: one pass
        return self._shuffle(P.ShuffleKind.SORT_BY, partitions, "sort_by", (source,), key,
                             bool(ascending))

    def shuffle(self, partitions: int) -> Dataset[T]:
        """The same items spread evenly over ``partitions`` partitions (repartition).

        Example::

            big.shuffle(16)
        """
        if partitions is None:
            raise ConfigError("shuffle: say how many partitions")
        return self._shuffle(P.ShuffleKind.SHUFFLE, partitions, "shuffle")

    def join(self: Dataset[tuple[K, V]], other: Dataset[tuple[K, W]],
             partitions: int | None = None) -> Dataset[tuple[K, tuple[V, W]]]:
        """Inner join on keys: ``(k, (v, w))`` for every pair of matching items (a key
        found m times here and n times there gives m * n items).

        Example::

            names.join(ages)                 # ("ann", "Ann"), ("ann", 31) -> ("ann", ("Ann", 31))
        """
        other = self._same_cluster(other, "join")
        return self._shuffle(P.ShuffleKind.JOIN, partitions, "join", (self._node, other._node))

    def left_join(self: Dataset[tuple[K, V]], other: Dataset[tuple[K, W]],
                  partitions: int | None = None) -> Dataset[tuple[K, tuple[V, W | None]]]:
        """Like ``join``, plus ``(k, (v, None))`` for items here whose key is not there.

        Example::

            orders.left_join(customers)
        """
        other = self._same_cluster(other, "left_join")
        return self._shuffle(P.ShuffleKind.LEFT_JOIN, partitions, "left_join",
                             (self._node, other._node))

    # ------------------------------------------------------------ caching
    def cache(self) -> Dataset[T]:
        """This dataset, kept in the workers' memory once computed (by the first action
        that needs it); lost partitions are recomputed from lineage.

        Example::

            points = mapre.from_items(cluster, data).cache()
            points.count(); points.count()   # the second reads the cached partitions
        """
        if isinstance(self._node, P.Cache) and not self._node.job_scoped:
            return self
        node = P.Cache(self._node, P.new_cache_prefix(self._engine.owner))
        finalizer = weakref.finalize(node, release_cache, weakref.ref(self._engine),
                                     node.key_prefix, node.locations)
        finalizer.atexit = False
        return self._then(node)

    def unpersist(self, timeout_s: float = 30.0) -> Dataset[T]:
        """Drop the cached partitions from the workers; later actions recompute them.

        Example::

            points.unpersist()
        """
        timeout_s = check_timeout(timeout_s, "unpersist")
        node = self._node
        if not isinstance(node, P.Cache) or node.job_scoped:
            raise MapreError("unpersist() is for a dataset returned by cache()")
        holders = node.holders()
        node.disabled = True
        node.clear()
        self._engine.delete(holders, (node.key_prefix + "/",), wait_s=timeout_s)
        return self

    @property
    def is_cached(self) -> bool:
        """True when every partition is held in the workers' memory."""
        return isinstance(self._node, P.Cache) and self._node.is_complete()

    # ------------------------------------------------------------ actions
    def collect(self, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                progress: bool | None = None) -> list[T]:
        """All items, in partition order. Partitions stream back one at a time.

        Example::

            mapre.from_items(cluster, range(5)).map(str).collect()   # ['0', ..., '4']
        """
        return list(actions.iterate(self._engine, self._node, check_timeout(timeout_s, "collect"),
                                     progress))

    def iterate(self, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                progress: bool | None = None) -> Iterator[T]:
        """All items as an iterator: like ``collect`` without a list of everything.

        Example::

            for word, n in counts.iterate(timeout_s=60):
                print(word, n)
        """
        return actions.iterate(self._engine, self._node, check_timeout(timeout_s, "iterate"),
                               progress)

    def count(self, *, timeout_s: float = DEFAULT_TIMEOUT_S,
              progress: bool | None = None) -> int:
        """How many items.

        Example::

            mapre.load(cluster, "book.txt").count()                   # lines in the book
        """
        return actions.count(self._engine, self._node, check_timeout(timeout_s, "count"),
                             progress)

    def reduce(self, op: Callable[[T, T], T], *, timeout_s: float = DEFAULT_TIMEOUT_S,
               progress: bool | None = None) -> T:
        """All items combined with ``op`` (associative and commutative).

        Raises:
            EmptyDatasetError: there are no items (``fold`` takes a zero).

        Example::

            mapre.from_items(cluster, [1, 2, 3]).reduce(operator.add)  # 6
        """
        _check_fn(op, "reduce")
        timeout_s = check_timeout(timeout_s, "reduce")
        return actions.reduce(self._engine, self._node, op, timeout_s, progress)

    def fold(self, zero: U, op: Callable[[U, T], U], *, timeout_s: float = DEFAULT_TIMEOUT_S,
             progress: bool | None = None) -> U:
        """``op`` over all items starting from ``zero`` in each partition, then over the
        partitions' results; ``zero`` must be neutral for ``op`` (0 for +, 1 for *).

        Example::

            mapre.from_items(cluster, [1, 2, 3]).fold(0, operator.add)  # 6
        """
        _check_fn(op, "fold")
        timeout_s = check_timeout(timeout_s, "fold")
        return actions.fold(self._engine, self._node, zero, op, timeout_s, progress)

    def reduce_by_key_locally(self: Dataset[tuple[K, V]], op: Callable[[V, V], V], *,
                              timeout_s: float = DEFAULT_TIMEOUT_S,
                              progress: bool | None = None) -> dict[K, V]:
        """``reduce_by_key(op)`` returned as a dict on the driver (PySpark's
        ``reduceByKeyLocally``): each partition is combined on its worker, and the driver
        merges the partitions as they finish, with no shuffle. For results that fit in the
        driver's memory.

        Example::

            words.map(lambda w: (w, 1)).reduce_by_key_locally(operator.add)  # {"a": 3, ...}
        """
        _check_fn(op, "reduce_by_key_locally")
        timeout_s = check_timeout(timeout_s, "reduce_by_key_locally")
        return actions.reduce_by_key_locally(self._engine, self._node, op, timeout_s, progress)

    def take(self, n: int, *, timeout_s: float = DEFAULT_TIMEOUT_S,
             progress: bool | None = None) -> list[T]:
        """The first ``n`` items (reads as few partitions as it can).

        Example::

            mapre.load(cluster, "book.txt").take(3)                   # the first 3 lines
        """
        return actions.take(self._engine, self._node, _count(n, "take"),
                            check_timeout(timeout_s, "take"),
                            progress)

    def top(self, n: int, key: Callable[[T], Any] | None = None, *,
            timeout_s: float = DEFAULT_TIMEOUT_S, progress: bool | None = None) -> list[T]:
        """The ``n`` largest items (by ``key``), largest first.

        Example::

            counts.top(10, key=lambda kv: kv[1])                      # ten most frequent
        """
        if key is not None:
            _check_fn(key, "top")
        return actions.top(self._engine, self._node, _count(n, "top"), key,
                           check_timeout(timeout_s, "top"),
                           progress)

    def save(self, directory: str | os.PathLike[str], *, overwrite: bool = False,
             timeout_s: float = DEFAULT_TIMEOUT_S, progress: bool | None = None) -> str:
        """Write one text file per partition (``part-00000``, ...; ``str(item)`` per line)
        and a ``_SUCCESS`` marker; ``mapre.load(cluster, directory)`` reads it back. The
        directory must be visible to every worker at the same path.

        Raises:
            OutputExists: the directory holds files and ``overwrite`` is False; with
                ``overwrite``, it holds anything but a previous save's output.

        Example::

            counts.map(lambda kv: f"{kv[0]}\\t{kv[1]}").save("out/counts")
        """
        return actions.save(self._engine, self._node, directory, overwrite,
                            check_timeout(timeout_s, "save"), progress)


_first = itemgetter(0)
_second = itemgetter(1)

"""Broadcast values: sent to every worker once, read by tasks through ``Broadcast.value``.

A ``Broadcast`` pickles as its key alone, so closures that capture it stay small; inside a
task ``value`` reads the worker's copy (fetching it from another holder if this worker joined
later). The task runner makes the worker's context reachable for that through a context
variable set only while a task of this engine runs.
"""
from __future__ import annotations

import contextvars
import itertools
import time
from typing import Any, Generic, TypeVar

from actorpy.errors import ActorpyError
from engines.mapre.errors import MapreError, check_timeout

T = TypeVar("T")

_task_ctx: contextvars.ContextVar[Any] = contextvars.ContextVar("actorpy_mapre_task_ctx")
#: when the running task's action gives up (time.monotonic()), for a broadcast's fetch
_task_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("actorpy_mapre_deadline")
_ids = itertools.count(1)
_UNSET: Any = object()


def bind(ctx: Any, timeout_s: float = 60.0) -> tuple[contextvars.Token[Any], ...]:
    """Make ``ctx`` the running task's context, with ``timeout_s`` left to its action (the
    task runner calls this)."""
    return (_task_ctx.set(ctx), _task_deadline.set(time.monotonic() + timeout_s))


def unbind(tokens: tuple[contextvars.Token[Any], ...]) -> None:
    _task_ctx.reset(tokens[0])
    _task_deadline.reset(tokens[1])


def store_stats() -> Any:
    """The ``StoreStats`` of the worker running the current task (for monitoring from a
    user function, e.g. how much of a shuffle spilled).

    Raises:
        MapreError: called outside a map-reduce task.
    """
    ctx = _task_ctx.get(None)
    if ctx is None:
        raise MapreError("store_stats() works only inside a map-reduce task")
    return ctx.store.stats()


class _Put:
    """Task: keep ``value`` in this worker's store under ``key``."""

    def __init__(self, key: str, value: Any) -> None:
        self.key, self.value = key, value

    def run(self, ctx: Any) -> int:
        return ctx.put(self.key, self.value)


class _Delete:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def run(self, ctx: Any) -> int:
        return ctx.delete(self.prefix)


class Broadcast(Generic[T]):
    """A read-only value on every worker (make one with ``mapre.broadcast``)."""

    def __init__(self, key: str, holders: tuple[str, ...], value: Any = _UNSET,
                 cluster: Any = None) -> None:
        self.key = key
        self.holders = holders
        self._value = value
        self._cluster = cluster

    @property
    def value(self) -> T:
        """The value: the driver's own object on the driver, the worker's copy in a task.

        Raises:
            MapreError: read outside a task of this engine and away from the driver.
        """
        if self._value is _UNSET:
            ctx = _task_ctx.get(None)
            if ctx is None:
                raise MapreError(f"broadcast {self.key} can be read on the driver that made "
                                 "it or inside a map-reduce task, not here")
            self._value = self._load(ctx)
        return self._value

    def _load(self, ctx: Any) -> Any:
        try:
            return ctx.get(self.key)
        except KeyError:
            pass
        errors = []
        for node in self.holders:
            if node == ctx.node_id:
                continue
            # the action's time, not a fixed minute: a large value on a slow link takes
            # longer (1 GB at 100 Mb/s: 80 s), and a lost holder fails the fetch at once
            left = _task_deadline.get(time.monotonic() + 60.0) - time.monotonic()
            try:
                value = ctx.fetch(node, self.key, timeout_s=max(1.0, left))
            except ActorpyError as exc:
                errors.append(f"{node}: {exc}".splitlines()[0])
                continue
            ctx.put(self.key, value)
            return value
        raise MapreError(f"broadcast {self.key} is on no live worker ({'; '.join(errors)}); "
                         "it was unpersisted, or every worker that held it is gone")

    def unpersist(self, timeout_s: float = 30.0) -> None:
        """Remove the value from every worker (tasks that read it afterwards fail)."""
        if self._cluster is None:
            raise MapreError("unpersist() works on the driver's Broadcast only")
        timeout_s = check_timeout(timeout_s, "unpersist")
        futures = [self._cluster.submit_task(_Delete(self.key), w)
                   for w in self._cluster.workers()]
        for fut in futures:
            try:
                fut.result(timeout_s)
            except ActorpyError:
                pass  # a worker that is gone holds nothing

    def __reduce__(self) -> Any:
        return (Broadcast, (self.key, self.holders))

    def __repr__(self) -> str:
        return f"<Broadcast {self.key} on {len(self.holders)} workers>"


def broadcast(cluster: Any, value: T, *, timeout_s: float = 60.0) -> Broadcast[T]:
    """Send ``value`` to every worker once; tasks read it as ``b.value``.

    Args:
        cluster: from ``actorpy.connect()``.
        value: anything picklable.
        timeout_s: how long to wait for every worker to hold it.

    Example::

        stop = mapre.broadcast(cluster, frozenset({"the", "a"}))
        words.filter(lambda w: w not in stop.value)
    """
    timeout_s = check_timeout(timeout_s, "broadcast")
    workers = tuple(cluster.workers())
    key = f"mapre/bcast/{cluster.node_id}-{next(_ids)}"
    futures = [cluster.submit_task(_Put(key, value), w) for w in workers]
    held, errors = [], []
    for worker, fut in zip(workers, futures):
        try:
            fut.result(timeout_s)
            held.append(worker)
        except ActorpyError as exc:
            errors.append(f"{worker}: {exc}".splitlines()[0])
    if not held:
        raise MapreError(f"no worker took broadcast {key} ({'; '.join(errors) or 'no workers'}); "
                         "check that the cluster has live workers")
    return Broadcast(key, tuple(held), value, cluster)

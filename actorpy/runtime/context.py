"""What a task or a service sees of its worker: the local object store, direct calls to other
workers and services, and the cluster's membership. Passed explicitly (no global context)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol

from actorpy.errors import ActorpyError
from actorpy.ids import NodeId
from actorpy.runtime import fetch as remote_store
from actorpy.runtime.node import Node
from actorpy.runtime.reply import ReplyFuture
from actorpy.runtime.store import DEFAULT_SEGMENT_BYTES, ObjectStore
from actorpy.wire import message as wm


@dataclass(frozen=True)
class ServiceRef:
    """Address of a long-lived service: the node hosting it and its service id there."""

    node: NodeId
    service: int
    name: str = ""


class Task(Protocol):
    """A unit of work sent to a worker. Engines define their own; ``run`` gets the context."""

    def run(self, ctx: WorkerContext) -> Any: ...


@dataclass(frozen=True)
class CallTask:
    """``fn(*args, **kwargs)`` as a task."""

    fn: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None

    def run(self, ctx: WorkerContext) -> Any:
        return self.fn(*self.args, **(self.kwargs or {}))


class Caller:
    """Calls any node can make: services, the object stores of other workers."""

    node: Node

    def call(self, ref: ServiceRef, kind: int, payload: Any = wm.NO_PAYLOAD, *,
             timeout_s: float, step: int = 0) -> Any:
        """Request ``kind`` from a service and wait for its reply (RemoteError if it raised)."""
        return self.node.call(ref.node, ref.service, kind, payload, timeout_s=timeout_s,
                              step=step, what=f"call {int(kind)} to service {ref.name or ref.service}")

    def call_async(self, ref: ServiceRef, kind: int, payload: Any = wm.NO_PAYLOAD, *,
                   step: int = 0) -> ReplyFuture:
        return self.node.request(ref.node, ref.service, kind, payload, step=step,
                                 what=f"call {int(kind)} to service {ref.name or ref.service}")

    def cast(self, ref: ServiceRef, kind: int, payload: Any = wm.NO_PAYLOAD, *,
             step: int = 0) -> None:
        """Send ``kind`` to a service without waiting for a reply."""
        self.node.send(ref.node, ref.service, kind, payload, step=step)

    def fetch(self, node: NodeId, key: str, *, timeout_s: float) -> Any:
        """A block straight from ``node``'s object store: the value ``put`` stored, or the
        items ``put_stream`` stored as one list (KeyError there -> RemoteError here)."""
        return remote_store.fetch(self.node, node, key, timeout_s=timeout_s)

    def fetch_async(self, node: NodeId, key: str) -> ReplyFuture:
        """``fetch`` without waiting: the future's ``result(timeout)`` gives the value."""
        return remote_store.fetch_async(self.node, node, key)

    def fetch_iter(self, node: NodeId, key: str, *, timeout_s: float) -> Iterator[Any]:
        """The items of a block on ``node``, one segment at a time (the next one already on
        its way), so a reader can merge a block many times its memory. ``timeout_s`` bounds
        the wait for each segment. See ``actorpy.runtime.fetch.fetch_iter``.

        Example (a reducer merging its shuffle blocks)::

            for owner in ctx.workers():
                for word, count in ctx.fetch_iter(owner, f"{job}/shuffle/{part}", timeout_s=60):
                    totals[word] += count
        """
        return remote_store.fetch_iter(self.node, node, key, timeout_s=timeout_s)

    def workers(self) -> list[NodeId]:
        """Live workers, in a stable order."""
        return sorted(p.node_id for p in self.node.peers("worker"))


class WorkerContext(Caller):
    """Handed to ``Task.run`` and to service factories on a worker."""

    def __init__(self, node: Node, store: ObjectStore) -> None:
        self.node = node
        self.store = store

    @property
    def node_id(self) -> NodeId:
        return self.node.node_id

    def put(self, key: str, value: Any) -> int:
        """Keep a snapshot of ``value`` here for other workers to ``fetch``; returns its size
        in bytes. Beyond the store's budget (Config.store_budget_bytes) it goes to disk.
        Use ``/`` to build keys by level (``"job/stage/part"``) so ``delete`` is cheap."""
        return self.store.put(key, value)

    def put_stream(self, key: str, items: Iterable[Any], *,
                   segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> int:
        """Keep the items of ``items`` as a stream, pickled in segments of about
        ``segment_bytes`` (each kept or spilled at once, so ``items`` may be a generator far
        larger than memory); readers use ``fetch_iter`` (or ``fetch`` for one list).
        Returns the block's size in bytes."""
        return self.store.put_stream(key, items, segment_bytes=segment_bytes)

    def get(self, key: str) -> Any:
        """A block from this worker's own store (KeyError if absent); arrays come back
        read-only, sharing the store's memory."""
        return self.store.get(key)

    def get_iter(self, key: str) -> Iterator[Any]:
        """The items of a block in this worker's own store, one segment at a time."""
        return self.store.iterate(key)

    def delete(self, prefix: str) -> int:
        """Remove every key starting with ``prefix`` (and its spill files); returns how many.
        Costs O(keys removed)."""
        return self.store.delete(prefix)

    def reply(self, msg: wm.Message, value: Any = None) -> None:
        """Answer a request a service received."""
        self.node.reply(msg, value)

    def reply_error(self, msg: wm.Message, exc: BaseException) -> None:
        self.node.reply_error(msg, exc)


class Service(Protocol):
    """A long-lived object on a worker, fed its messages one at a time, in arrival order."""

    def handle(self, msg: wm.Message, ctx: WorkerContext) -> None: ...


def check_service(obj: Any) -> Any:
    if not callable(getattr(obj, "handle", None)):
        raise ActorpyError(f"a service factory must return an object with handle(msg, ctx); "
                           f"got {type(obj).__qualname__}")
    return obj

"""What a task or a service sees of its worker: the local object store, direct calls to other
workers and services, and the cluster's membership. Passed explicitly (no global context)."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from actorpy.errors import ActorpyError
from actorpy.ids import NodeId
from actorpy.runtime.node import Node
from actorpy.runtime.reply import ReplyFuture
from actorpy.wire import message as wm
from actorpy.wire.kinds import CORE_SERVICE, Kind


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


class ObjectStore:
    """Values a worker keeps for others to fetch (shuffle blocks, broadcast values).
    Kept serialized, so a fetch sends the stored frames without pickling again."""

    def __init__(self, chunk_bytes: int) -> None:
        self._items: dict[str, wm.Encoded] = {}
        self._lock = threading.Lock()
        self._chunk_bytes = chunk_bytes

    def put(self, key: str, value: Any) -> int:
        enc = wm.Encoded.of(value, self._chunk_bytes)
        with self._lock:
            self._items[key] = enc
        return enc.nbytes

    def get_encoded(self, key: str) -> wm.Encoded | None:
        with self._lock:
            return self._items.get(key)

    def delete(self, prefix: str) -> int:
        """Remove every key starting with ``prefix``; returns how many."""
        with self._lock:
            doomed = [k for k in self._items if k.startswith(prefix)]
            for k in doomed:
                del self._items[k]
        return len(doomed)

    def __len__(self) -> int:
        return len(self._items)


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
        """Fetch a value straight from ``node``'s object store (KeyError there -> RemoteError)."""
        return self.node.call(node, CORE_SERVICE, Kind.FETCH, key, timeout_s=timeout_s,
                              what=f"fetch of {key!r}")

    def fetch_async(self, node: NodeId, key: str) -> ReplyFuture:
        return self.node.request(node, CORE_SERVICE, Kind.FETCH, key, what=f"fetch of {key!r}")

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
        """Keep ``value`` here for other workers to ``fetch``; returns its size in bytes."""
        return self.store.put(key, value)

    def get(self, key: str) -> Any:
        """A value from this worker's own store (KeyError if absent)."""
        enc = self.store.get_encoded(key)
        if enc is None:
            raise KeyError(key)
        return enc.decode()

    def delete(self, prefix: str) -> int:
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

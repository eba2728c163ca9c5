"""What a task or a service sees of its worker: the local object store, direct calls to other
workers and services, and the cluster's membership. Passed explicitly (no global context)."""
from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from actorpy.errors import ActorpyError, ActorpyTimeout, NodeLost, ServiceNotFound
from actorpy.ids import NodeId
from actorpy.runtime.membership import MANAGER_ID
from actorpy.runtime.node import Node, Subscription
from actorpy.runtime.reply import ReplyFuture
from actorpy.wire import message as wm
from actorpy.wire.kinds import CORE_SERVICE, Kind

if TYPE_CHECKING:
    from actorpy.runtime.host import ServiceHost
    from actorpy.runtime.service_context import ServiceDied


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
    #: the services this node hosts (None where it hosts none)
    services: ServiceHost | None = None
    #: the id of the service whose messages these are (0: the node itself)
    _from_service: int = 0
    _picks: int = 0

    def call(self, ref: ServiceRef, kind: int, payload: Any = wm.NO_PAYLOAD, *,
             timeout_s: float, step: int = 0) -> Any:
        """Request ``kind`` from a service and wait for its reply (RemoteError if it raised)."""
        return self.node.call(ref.node, ref.service, kind, payload, timeout_s=timeout_s,
                              step=step, what=f"call {int(kind)} to service {ref.name or ref.service}",
                              from_service=self._from_service)

    def call_async(self, ref: ServiceRef, kind: int, payload: Any = wm.NO_PAYLOAD, *,
                   step: int = 0) -> ReplyFuture:
        return self.node.request(ref.node, ref.service, kind, payload, step=step,
                                 what=f"call {int(kind)} to service {ref.name or ref.service}",
                                 from_service=self._from_service)

    def cast(self, ref: ServiceRef, kind: int, payload: Any = wm.NO_PAYLOAD, *,
             step: int = 0) -> None:
        """Send ``kind`` to a service without waiting for a reply."""
        self.node.send(ref.node, ref.service, kind, payload, step=step,
                       from_service=self._from_service)

    # ------------------------------------------------------------------ services
    def start_service(self, factory: Callable[..., Any], /, *args: Any,
                      node: NodeId | None = None, name: str = "", timeout_s: float = 60.0,
                      **kwargs: Any) -> ServiceRef:
        """Construct ``factory(ctx, *args, **kwargs)`` as a long-lived service on ``node``
        (default: a worker the cluster picks; this node's own id hosts it here).

        It runs on a thread of its own, outside the task pool, so it starts at once even
        while long tasks run. It gets its messages one at a time, in order (see
        ``actorpy.runtime.service.Service`` for handlers per kind), and stops with
        ``stop_service`` or when this node goes away. With a ``name`` (unique in the
        cluster) others find it with ``lookup(name)``.

        Raises:
            RemoteError: the factory raised, or the name is taken (ServiceError as cause);
                on this node itself, the factory's own exception.
            ActorpyTimeout: the service did not start within ``timeout_s``.
        """
        fut = self.start_service_async(factory, *args, node=node, name=name, **kwargs)
        try:
            return fut.result(timeout_s)
        except (TimeoutError, FutureTimeout):  # distinct classes before Python 3.11
            if fut.done():  # the factory itself raised a TimeoutError
                raise
            raise ActorpyTimeout(f"service {name or factory!r} did not start on "
                                 f"{node or 'a worker'} within {timeout_s} s") from None
        finally:
            if isinstance(fut, ReplyFuture) and not fut.done():
                self.node.forget(fut)

    def start_service_async(self, factory: Callable[..., Any], /, *args: Any,
                            node: NodeId | None = None, name: str = "",
                            **kwargs: Any) -> Future:
        """Like ``start_service``; the future's result is the ServiceRef."""
        dest = node if node is not None else self._pick_worker()
        spec = (factory, args, kwargs, name)
        if dest == self.node.node_id:
            if self.services is None:
                raise ActorpyError(f"node {dest} hosts no services")
            return self.services.start_local(spec, owner=self.node.node_id)
        return self.node.request(dest, CORE_SERVICE, Kind.SERVICE_START, spec,
                                 what=f"start of service {name or factory!r}",
                                 from_service=self._from_service)

    def stop_service(self, ref: ServiceRef, timeout_s: float = 10.0) -> bool:
        """Stop a service (it finishes the messages it has, then ``close()`` runs); False
        if it was not running."""
        if ref.node == self.node.node_id and self.services is not None:
            return self.services.stop(ref.service, f"stopped by {self.node.node_id}")
        return self.node.call(ref.node, CORE_SERVICE, Kind.SERVICE_STOP, ref.service,
                              timeout_s=timeout_s, what="service stop",
                              from_service=self._from_service)

    def lookup(self, name: str, *, timeout_s: float = 10.0) -> ServiceRef:
        """The service registered under ``name`` (names are unique in the cluster; the
        manager keeps them, and forgets them when the service or its node goes).

        Raises:
            ServiceNotFound: no live service has that name.
        """
        ref = self.lookup_async(name).result(timeout_s)
        if ref is None:
            raise ServiceNotFound(f"no service named {name!r} in this cluster; start it with "
                                  "start_service(..., name=...) first")
        return ref

    def lookup_async(self, name: str) -> ReplyFuture:
        """Like ``lookup``; the future's result is a ServiceRef or None."""
        return self.node.request(MANAGER_ID, CORE_SERVICE, Kind.NAME_LOOKUP, name,
                                 what=f"lookup of service {name!r}",
                                 from_service=self._from_service)

    def on_service_died(self, listener: Callable[[ServiceDied], None]) -> Subscription:
        """Call ``listener(ServiceDied)`` when a service this node started dies (an error
        ended its thread). It runs on the I/O thread: be quick, never block."""
        if self.services is None:
            raise ActorpyError(f"node {self.node.node_id} starts no services")
        return self.services.on_service_died(listener)

    def _pick_worker(self) -> NodeId:
        workers = self.workers()
        if not workers:
            raise NodeLost("-", "no live workers in this cluster")
        self._picks += 1
        return workers[self._picks % len(workers)]

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

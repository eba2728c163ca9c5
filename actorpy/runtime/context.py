"""What a task or a service sees of its worker: the local object store, direct calls to other
workers and services, and the cluster's membership. Passed explicitly (no global context)."""
from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol

from actorpy.errors import ActorpyError, ActorpyTimeout, NodeLost, ServiceNotFound
from actorpy.ids import NodeId
from actorpy.runtime import fetch as remote_store
from actorpy.runtime.membership import MANAGER_ID
from actorpy.runtime.node import Node, Subscription
from actorpy.runtime.reply import ReplyFuture
from actorpy.runtime.store import DEFAULT_SEGMENT_BYTES, ObjectStore
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
                              step=step,
                              what=f"call {int(kind)} to service {ref.name or ref.service}",
                              from_service=self._from_service)

    def call_async(self, ref: ServiceRef, kind: int, payload: Any = wm.NO_PAYLOAD, *,
                   step: int = 0, direct: bool = False) -> ReplyFuture:
        """Request ``kind`` from a service; the future resolves with its reply. With
        ``direct`` the reply comes to this thread's own socket (see ``Node.request``): wait
        for it on this thread (``node.wait`` or the future's ``result``)."""
        return self.node.request(ref.node, ref.service, kind, payload, step=step,
                                 what=f"call {int(kind)} to service {ref.name or ref.service}",
                                 from_service=self._from_service, direct=direct)

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

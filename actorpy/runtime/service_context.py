"""What a service sees: ``ServiceContext``. Everything that concerns a service reaches it on
its own thread, in order: its messages, the replies to its own requests
(``request(..., on_reply=)``), its timers (``schedule``) and membership events
(``subscribe``). Its messages carry its service id (``msg.from_service`` at the receiver).

A service therefore needs no locks, and two services can call each other without
deadlock: each sends ``request(..., on_reply=)`` and goes on serving; a blocking ``call``
from inside a handler is only safe towards a service that never calls back.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from actorpy.errors import ActorpyError, ActorpyTimeout, ProtocolError
from actorpy.ids import NodeId
from actorpy.runtime import remote
from actorpy.runtime.context import ServiceRef, WorkerContext
from actorpy.runtime.node import NodeEvent, Subscription, TimerHandle
from actorpy.runtime.reply import ReplyFuture
from actorpy.wire import message as wm
from actorpy.wire.kinds import CORE_SERVICE, Kind

if TYPE_CHECKING:
    from actorpy.runtime.host import ServiceHost
    from actorpy.runtime.runner import ServiceRunner

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class ServiceDied:
    """A service this node started has died: ``reason`` says how (type and message)."""

    ref: ServiceRef
    reason: str


class Reply:
    """A request's answer, to give later (a *deferred reply*): keep it, go on serving, and
    ``send`` or ``fail`` it from a later message or timer. Answer once; any thread may.

    If the service stops first, the caller gets a ServiceDead ERROR instead of waiting.
    """

    __slots__ = ("_ctx", "sender", "from_service", "request_id", "step", "route", "_done",
                 "_lock")

    def __init__(self, ctx: ServiceContext, msg: wm.Message) -> None:
        self._ctx = ctx
        self.sender = NodeId(msg.sender)
        self.from_service = msg.from_service
        self.request_id = msg.header.request_id
        self.step = msg.header.step
        self.route = msg.route
        self._done = False
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        return self._done

    def send(self, value: Any = None) -> None:
        """Answer with ``value``. If it cannot be sent (it does not pickle) the caller gets
        that error instead, and it is raised here too.

        Unlike a handler's return value, ``value``'s arrays are not copied first: they may
        still be on their way after this returns, so send only arrays nothing changes
        afterwards (the parameter server's read-only store values rely on this). A requester
        on this node gets read-only views of them, not copies.

        Raises:
            ActorpyError: the request was answered already.
        """
        self._claim()
        try:
            self._ctx._send_reply(self, Kind.RESULT, value)
        except Exception as exc:
            self._ctx._send_reply(self, Kind.ERROR, remote.capture(exc, self._ctx.node_id))
            raise

    def fail(self, exc: BaseException) -> None:
        """Answer with an error (RemoteError at the caller, ``exc`` chained as its cause)."""
        self._claim()
        self._ctx._send_reply(self, Kind.ERROR, remote.capture(exc, self._ctx.node_id))

    def _claim(self) -> None:
        with self._lock:
            if self._done:
                raise ActorpyError(f"request {self.request_id} from {self.sender} was "
                                   "answered already")
            self._done = True
        self._ctx._runner.forget_reply(self)


class ServiceTimer:
    """A timer from ``ServiceContext.schedule``; ``cancel()`` before it runs and it never
    will (cancelling from the service's own thread is exact)."""

    __slots__ = ("fn", "args", "cancelled", "_handle")

    def __init__(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.cancelled = False
        self._handle: TimerHandle | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self._handle is not None:
            self._handle.cancel()


class ServiceClock:
    """The ``actorpy.clock.Clock`` of a service: monotonic time, and timers that run on the
    service's thread (hand it to sans-I/O protocol code, e.g. a Kademlia node)."""

    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = ctx

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> ServiceTimer:
        return self._ctx.schedule(delay_s, callback)


class ServiceContext(WorkerContext):
    """Handed to a service's factory and to its ``handle``: a WorkerContext (calls, casts,
    fetches, and the object store on a worker) whose messages carry this service's id,
    plus what a service needs to serve without blocking or locks.

    Methods that take callbacks (``request``, ``when_done``, ``schedule``, ``subscribe``,
    ``on_service_died``) run them later on the service's own thread, between messages.
    """

    def __init__(self, node: Any, store: Any, host: ServiceHost, runner: ServiceRunner,
                 ref: ServiceRef) -> None:
        super().__init__(node, store)
        self.services = host
        self._runner = runner
        self.ref = ref
        self._from_service = ref.service
        self.clock = ServiceClock(self)
        # Deadlines of requests in flight: one node timer, armed for the earliest, instead
        # of one per request (each would wake the I/O thread from this thread to set it and
        # again to cancel it). Entries of answered requests are dropped lazily when they
        # reach the top, and in bulk when the heap has doubled.
        self._deadlines: list[tuple[float, int, ReplyFuture, float]] = []
        self._deadline_seq = itertools.count()
        self._deadline_lock = threading.Lock()
        self._armed: tuple[float, TimerHandle] | None = None
        self._prune_at = 1024

    @property
    def service_id(self) -> int:
        return self.ref.service

    # ------------------------------------------------------------------ async requests
    def request(self, ref: ServiceRef, kind: int, payload: Any = wm.NO_PAYLOAD, *,
                on_reply: Callable[[ReplyFuture], None], timeout_s: float,
                step: int = 0) -> ReplyFuture:
        """Send a request and go on serving; ``on_reply(fut)`` runs on this service's thread
        when the reply comes, ``timeout_s`` passes (``fut.result()`` then raises
        ActorpyTimeout) or the node dies (NodeLost). Call ``fut.result()`` in it for the
        value or the error.

        Example (a Kademlia peer with alpha lookups in flight)::

            for peer in closest[:alpha]:
                ctx.request(peer, FIND_NODE, target, timeout_s=1.0,
                            on_reply=lambda fut, p=peer: self.found(p, fut))
        """
        what = f"request {int(kind)} to service {ref.name or ref.service}"
        fut = self.node.request(ref.node, ref.service, kind, payload, step=step, what=what,
                                from_service=self.service_id)
        if not fut.done():
            self._watch(fut, timeout_s)
        self.when_done(fut, on_reply)
        return fut

    def when_done(self, fut: Future, fn: Callable[[Any], None]) -> None:
        """Run ``fn(fut)`` on this service's thread once ``fut`` is done (any future: a
        ``call_async``, a ``fetch_async``, a ``start_service_async``...)."""
        fut.add_done_callback(lambda f: self._runner.post(fn, f))

    def _watch(self, fut: ReplyFuture, timeout_s: float) -> None:
        due = time.monotonic() + timeout_s
        with self._deadline_lock:
            if len(self._deadlines) >= self._prune_at:
                self._deadlines = [e for e in self._deadlines if not e[2].done()]
                heapq.heapify(self._deadlines)
                self._prune_at = max(1024, 2 * len(self._deadlines))
            heapq.heappush(self._deadlines, (due, next(self._deadline_seq), fut, timeout_s))
            if self._armed is None or due < self._armed[0]:
                self._arm(due, timeout_s)

    def _arm(self, due: float, delay_s: float) -> None:
        """Set the one deadline timer (caller holds ``_deadline_lock``)."""
        if self._armed is not None:
            self._armed[1].cancel()
        self._armed = (due, self.node.call_later(max(0.0, delay_s), self._sweep))

    def _sweep(self) -> None:
        """Fail the requests whose deadline passed (I/O thread); re-arm for the next."""
        now = time.monotonic()
        expired = []
        with self._deadline_lock:
            self._armed = None
            heap = self._deadlines
            while heap and (heap[0][2].done() or heap[0][0] <= now):
                _, _, fut, timeout_s = heapq.heappop(heap)
                if not fut.done():
                    expired.append((fut, timeout_s))
            if heap:
                self._arm(heap[0][0], heap[0][0] - now)
        for fut, timeout_s in expired:
            self._expire(fut, timeout_s)

    def _expire(self, fut: ReplyFuture, timeout_s: float) -> None:
        if fut.done():
            return
        self.node.forget(fut)
        try:
            fut.set_exception(ActorpyTimeout(
                f"{fut.what} on {fut.dest} got no reply within {timeout_s} s"))
        except InvalidStateError:  # the reply won the race
            pass

    # ------------------------------------------------------------------ timers, events
    def schedule(self, delay_s: float, fn: Callable[..., None], *args: Any) -> ServiceTimer:
        """Run ``fn(*args)`` on this service's thread after ``delay_s`` seconds; ``cancel()``
        the returned timer to stop it. Pending timers are cancelled when the service stops."""
        timer = ServiceTimer(fn, args)
        self._runner.add_timer(timer)
        timer._handle = self.node.call_later(max(0.0, delay_s),
                                             lambda: self._runner.post_timer(self._fire, timer))
        return timer

    def post(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on this service's thread after the messages already in its
        inbox: a ``schedule(0, ...)`` without the hop through the node's I/O thread."""
        self._runner.post(fn, *args)

    def post_timer(self, fn: Callable[..., None], *args: Any) -> None:
        """``post`` a timer that is due now: while the service is stepped aside
        (``unlocked``), messages that come after it may be handled first."""
        self._runner.post_timer(fn, *args)

    def unlocked(self, work: Callable[[], T], after_s: float = 0.0) -> T:
        """Run ``work()`` on this service's thread with the service stepped aside: meanwhile
        its ``quick_kinds`` and ``aside_kinds`` may be handled on the node's I/O thread, one
        at a time and in order, those queued first (while its inbox holds nothing else but
        timers due, which wait for the service's thread); the service's state is its own
        again once ``work`` returns. ``work`` must touch none of the state those handlers
        touch (a P2P peer's user ``push``: it answers the pushes of other peers meanwhile).
        Run from anywhere but the service's thread handling an item, it just runs ``work``.
        ``after_s``: the I/O thread takes messages only once ``work`` has run this long
        (those that came before it then first): a short ``work`` runs with the service
        locked, as its messages would not wait long, and handling them beside it costs
        both threads turns at the interpreter lock."""
        box = self._runner.mailbox
        if threading.current_thread() is not self._runner.thread \
                or not box.step_aside(after_s):
            return work()
        try:
            return work()
        finally:
            box.step_back()

    def _fire(self, timer: ServiceTimer) -> None:
        self._runner.drop_timer(timer)
        if not timer.cancelled:
            timer.fn(*timer.args)

    def subscribe(self, listener: Callable[[NodeEvent], None]) -> Subscription:
        """Call ``listener(event)`` on this service's thread for each membership change
        (a ``NodeEvent``: JOINED, LEFT or DEAD, with node id, role and reason). Cancelled
        when the service stops."""
        sub = self.node.subscribe(lambda event: self._runner.post(listener, event))
        self._runner.add_subscription(sub)
        return sub

    def on_service_died(self, listener: Callable[[ServiceDied], None]) -> Subscription:
        """Call ``listener(ServiceDied)`` on this service's thread when a service this node
        started dies. Cancelled when the service stops."""
        sub = self.services.on_service_died(lambda died: self._runner.post(listener, died))
        self._runner.add_subscription(sub)
        return sub

    # ------------------------------------------------------------------ replies
    def reply(self, msg: wm.Message, value: Any = None) -> None:
        self.node.reply(msg, value, from_service=self.service_id)

    def reply_error(self, msg: wm.Message, exc: BaseException) -> None:
        self.node.reply_error(msg, exc, from_service=self.service_id)

    def defer(self, msg: wm.Message) -> Reply:
        """Keep ``msg``'s answer for later (see ``Reply``); ``msg`` must be a request."""
        if not msg.header.request_id:   # the sender's mistake: dropped with a WARNING
            raise ProtocolError(f"kind {msg.kind} from {msg.sender} is a cast: it has no "
                                "reply to defer")
        reply = Reply(self, msg)
        self._runner.add_reply(reply)
        return reply

    def _send_reply(self, reply: Reply, kind: Kind, value: Any) -> None:
        self.node.send(reply.sender, CORE_SERVICE, kind, value, request_id=reply.request_id,
                       from_service=self.service_id, route=reply.route, share=True)

    # ------------------------------------------------------------------ blocking calls
    def call(self, ref: ServiceRef, kind: int, payload: Any = wm.NO_PAYLOAD, *,
             timeout_s: float, step: int = 0) -> Any:
        """A blocking call (see Caller.call). Never towards this service itself, nor towards
        a service that may call back: use ``request(..., on_reply=)`` for those."""
        if ref.node == self.node_id and ref.service == self.service_id:
            raise ActorpyError(f"service {self.ref.name or self.service_id} called itself and "
                               "would wait forever: handle the message directly instead")
        return super().call(ref, kind, payload, timeout_s=timeout_s, step=step)

    def put(self, key: str, value: Any) -> int:
        self._need_store()
        return super().put(key, value)

    def get(self, key: str) -> Any:
        self._need_store()
        return super().get(key)

    def delete(self, prefix: str) -> int:
        self._need_store()
        return super().delete(prefix)

    def _need_store(self) -> None:
        if self.store is None:
            raise ActorpyError(f"service {self.ref.name or self.service_id} runs on "
                               f"{self.node_id}, which has no object store (only workers do)")

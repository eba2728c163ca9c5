"""One service's thread: it decodes the start request, runs the factory, then feeds the
service its inbox one item at a time (messages, and the control items its context posts:
replies to its requests, timers, events). Its end, by stop or by death, answers whatever
still waits for it (see actorpy.runtime.host for who is told)."""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable

from actorpy.errors import ActorpyError, ServiceDead
from actorpy.ids import NodeId
from actorpy.log import Throttle
from actorpy.runtime.context import ServiceRef, check_service
from actorpy.runtime.mailbox import Mailbox
from actorpy.runtime.node import Subscription
from actorpy.runtime.service_context import Reply, ServiceContext, ServiceTimer
from actorpy.wire import message as wm

if TYPE_CHECKING:
    from actorpy.runtime.host import ServiceHost

log = logging.getLogger(__name__)
#: failed casts, reported once per interval per (service, kind, sender)
_FAILURES = Throttle()

#: (factory, args, kwargs, name): what SERVICE_START carries
Spec = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], str]

_STOP = object()


def _no_spec() -> Spec:
    raise ActorpyError("a service's start request is used once")


def _no_outcome(outcome: ServiceRef | BaseException) -> None:
    """What a runner holds once its start was reported (nothing more to report)."""


class ServiceRunner:
    """One service's thread: constructs it, then feeds it its inbox one item at a time."""

    def __init__(self, host: ServiceHost, sid: int, owner: NodeId, spec: Callable[[], Spec],
                 started: Callable[[ServiceRef | BaseException], None]) -> None:
        self.host, self.sid, self.owner = host, sid, owner
        self.mailbox = Mailbox(host.inbox_items, host.inbox_bytes)
        self.ref = ServiceRef(host.node.node_id, sid)
        self.service: Any = None
        self.ctx: ServiceContext | None = None
        self.reason = ""
        self.bound_name = ""
        self._spec, self._started = spec, started
        self._lock = threading.Lock()
        self._timers: set[ServiceTimer] = set()
        self._subs: list[Subscription] = []
        self._replies: set[Reply] = set()
        self._drain_armed = False   # a ``_drain`` is due on the node's I/O thread
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"actorpy-service-{sid}")

    @property
    def label(self) -> str:
        name = f"{self.ref.name!r} " if self.ref.name else ""
        return f"{name}(id {self.sid}) on {self.ref.node}"

    # ------------------------------------------------------------------ for the context
    def post(self, fn: Callable[..., Any], *args: Any) -> bool:
        return self.mailbox.post((fn, args))

    def post_timer(self, fn: Callable[..., Any], *args: Any) -> bool:
        return self.mailbox.post((fn, args), timer=True)

    def add_timer(self, timer: ServiceTimer) -> None:
        with self._lock:
            self._timers.add(timer)

    def drop_timer(self, timer: ServiceTimer) -> None:
        with self._lock:
            self._timers.discard(timer)

    def add_subscription(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.append(sub)

    def add_reply(self, reply: Reply) -> None:
        with self._lock:
            self._replies.add(reply)

    def forget_reply(self, reply: Reply) -> None:
        with self._lock:
            self._replies.discard(reply)

    def stop(self) -> None:
        self.mailbox.refuse_messages()
        self.mailbox.post(_STOP)

    def run_here(self, msg: wm.Message) -> bool:
        """Handle ``msg`` on the calling thread (the node's I/O thread) if its kind is one of
        the service's ``quick_kinds`` and the service is idle, or stepped aside with only
        messages of those kinds and its ``aside_kinds`` queued (run first, in order); one of
        the ``aside_kinds``, only while the service is stepped aside. False: queue it
        instead (to be run from a node timer once a service stepped aside may be claimed)."""
        quick = msg.kind in getattr(self.service, "quick_kinds", ())
        if not quick and msg.kind not in getattr(self.service, "aside_kinds", ()):
            return False
        if self.mailbox.claim(aside_only=not quick):
            queued: list[Any] = []
        else:   # stepped aside (``ServiceContext.unlocked``): messages queued, or too soon
            queued = self._claim_queued()
            if queued is None:
                self._drain_later()
                return False
        self._run_claimed([*queued, msg])
        return True

    def _claim_queued(self) -> list[Any] | None:
        kinds = frozenset(getattr(self.service, "quick_kinds", ())).union(
            getattr(self.service, "aside_kinds", ()))
        return self.mailbox.claim_queued(
            lambda item: isinstance(item, wm.Message) and item.kind in kinds)

    def _drain_later(self) -> None:
        """A message queued while the service stepped aside, before its box may be claimed:
        the I/O thread runs the queue then (unless the service took its box back)."""
        wait = self.mailbox.lent_in()
        if wait is not None and not self._drain_armed:
            self._drain_armed = True
            self.host.node.call_later(wait, self._drain)

    def _drain(self) -> None:
        self._drain_armed = False
        queued = self._claim_queued()
        if queued is None:
            self._drain_later()     # stepped aside again meanwhile, not claimable yet
        else:
            self._run_claimed(queued)

    def _run_claimed(self, messages: list[Any]) -> None:
        try:
            for item in messages:
                self._handle(item)
        finally:
            self.mailbox.release()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        if not self._construct():
            return
        current: wm.Message | None = None
        try:
            while (item := self.mailbox.get()) is not _STOP:
                if isinstance(item, wm.Message):
                    current = item
                    self._handle(item)
                    current = None
                else:
                    fn, args = item
                    self._callback(fn, args)
        except BaseException as exc:  # SystemExit in a handler, a bug here: never silent
            self._die(exc, current)
            return
        self._finish(self.host.gone_error(self.reason or f"service {self.label} was stopped"))

    def _construct(self) -> bool:
        # The start request is let go of once used: kept, its frames (a model's init values:
        # hundreds of MB on a parameter server's shard) lived as long as the service.
        spec, self._spec = self._spec, _no_spec
        started, self._started = self._started, _no_outcome
        try:
            factory, args, kwargs, name = spec()
            del spec
            if name:
                self.host.bind_name(name, self.sid)
                self.bound_name = name
            self.ref = ServiceRef(self.host.node.node_id, self.sid, name)
            self.ctx = ServiceContext(self.host.node, self.host.store, self.host, self, self.ref)
            self.service = check_service(factory(self.ctx, *args, **kwargs))
        except BaseException as exc:  # reported to whoever asked, even a SystemExit
            log.info("service %s failed to start: %s: %s", self.label, type(exc).__name__, exc)
            self.host.runner_failed(self)
            self._finish(ServiceDead(f"service {self.label} failed to start"))
            started(exc)
            return False
        log.info("service %s started for %s", self.label, self.owner)
        started(self.ref)
        return True

    def _handle(self, msg: wm.Message) -> None:
        try:
            self.service.handle(msg, self.ctx)
        except Exception as exc:  # the caller sees it; the service keeps serving
            if self.host.node.closed:
                # the node shut down under a message already taken (its manager gone, say):
                # its reply fails with NodeLost, and no answer can leave any more
                log.debug("service %s: kind %d from %s ran as its node closed", self.label,
                          msg.kind, msg.sender, exc_info=True)
            elif msg.header.request_id:
                self._answer_error(msg, exc)
            else:
                _FAILURES.log(log, (self.label, msg.kind, msg.sender), "service %s failed on "
                              "kind %d from %s", self.label, msg.kind, msg.sender,
                              level=logging.ERROR, exc_info=True)

    def _answer_error(self, msg: wm.Message, exc: Exception) -> None:
        try:
            assert self.ctx is not None
            self.ctx.reply_error(msg, exc)
        except Exception as again:  # e.g. an exception whose __str__ raises
            _FAILURES.log(log, (self.label, "error reply", msg.sender), "service %s could not "
                          "send its error to %s", self.label, msg.sender, level=logging.ERROR,
                          exc_info=True)
            self._quiet_error(msg, ActorpyError(
                f"service {self.label} failed on kind {msg.kind} with {type(exc).__name__}, "
                f"and that error could not be sent ({type(again).__name__})"))

    def _quiet_error(self, msg: wm.Message, exc: Exception) -> None:
        try:
            self.host.node.reply_error(msg, exc, from_service=self.sid)
        except Exception:
            log.debug("could not answer %s", msg.sender, exc_info=True)

    def _callback(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception:
            if self.host.node.closed:
                # the node shut down under a timer or reply that was already due: its
                # sends fail with NodeLost, which is the shutdown, not a failure
                log.debug("service %s: callback %s ran as its node closed", self.label,
                          getattr(fn, "__qualname__", fn), exc_info=True)
                return
            log.exception("service %s: callback %s failed", self.label,
                          getattr(fn, "__qualname__", fn))

    def _die(self, exc: BaseException, current: wm.Message | None) -> None:
        try:
            reason = f"service {self.label} died: {type(exc).__name__}: {exc}"
        except Exception:
            reason = f"service {self.label} died: {type(exc).__name__}"
        self.reason = reason
        err = ServiceDead(reason)
        try:
            log.error("%s", reason, exc_info=exc)
            if current is not None and current.header.request_id:
                self._quiet_error(current, err)
            self.host.runner_died(self, reason)
        finally:
            self._finish(err)

    def _finish(self, err: ActorpyError) -> None:
        """The service is over: answer what waits for it with ``err``, drop its timers and
        listeners."""
        for item in self.mailbox.close():
            if isinstance(item, wm.Message) and item.header.request_id:
                self._quiet_error(item, err)
        with self._lock:
            timers, self._timers = self._timers, set()
            subs, self._subs = self._subs, []
            replies, self._replies = self._replies, set()
        for timer in timers:
            timer.cancel()
        for sub in subs:
            sub.cancel()
        for reply in replies:
            if not reply.done:
                try:
                    reply.fail(err)
                except Exception:
                    log.debug("could not fail a deferred reply", exc_info=True)
        close = getattr(self.service, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                log.exception("service %s failed to close", self.label)
        # the service holds its context, which holds this runner: let go of it, so that it
        # (and what it holds: a P2P peer's data, hundreds of MB) is freed now, not at some
        # later cyclic collection, which large arrays do little to bring on
        self.service = None

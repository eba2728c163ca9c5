"""The services one node hosts (a worker's, or the driver's): one thread and one bounded
inbox each, started outside the task pool, found by name, never silently gone.

The I/O thread only routes: a message for a service is offered to its inbox (never
waiting; a full inbox refuses it, see ``Mailbox``), and the service's own thread does the
rest, including decoding the start request and constructing the service. The one exception:
a message of a kind the service declares quick (``Service.quick_kinds``) is handled on the
I/O thread itself when the service is idle and its inbox empty (one thread hand-off less).
A service whose thread dies is logged at ERROR, the node that started it is told
(SERVICE_DIED), requests queued for it get an ERROR naming it, and so do later ones while
its id is not reused.
"""
from __future__ import annotations

import itertools
import logging
import threading
from concurrent.futures import Future
from typing import Any, Callable

from actorpy.config import Config
from actorpy.errors import ActorpyError, NodeLost, ServiceDead, ServiceOverloaded
from actorpy.ids import NodeId
from actorpy.log import Throttle
from actorpy.runtime.context import ServiceRef
from actorpy.runtime.mailbox import MAX_SERVICE_ID, Mailbox, Offer, ServiceIds
from actorpy.runtime.membership import MANAGER_ID
from actorpy.runtime.node import Node, NodeEvent, NodeEventKind, Subscription
from actorpy.runtime.runner import ServiceRunner, Spec
from actorpy.runtime.service_context import ServiceDied
from actorpy.wire import message as wm
from actorpy.wire.kinds import CORE_SERVICE, Kind

log = logging.getLogger(__name__)

#: how the reason of a service stopped on purpose reads (not a death: casts to it are quiet)
_STOPPED = " was stopped ("

_NAME_MAX = 200


class ServiceHost:
    """Hosts services on ``node``: handles SERVICE_START / SERVICE_STOP / SERVICE_DIED and
    receives every message for a service id other than the core's.

    Args:
        node: this process's node.
        config: the inbox high-water marks.
        store: the object store services see (None on a driver).
        max_services: ids available (the header allows 65 535; tests use fewer).
        names: whether a manager keeps service names (False for nodes without one).
    """

    def __init__(self, node: Node, config: Config, store: Any = None, *,
                 max_services: int = MAX_SERVICE_ID, names: bool = True) -> None:
        self.node = node
        self.store = store
        self.inbox_items = config.service_inbox_items
        self.inbox_bytes = config.service_inbox_bytes
        self._names = names
        self._ids = ServiceIds(max_services)
        self._runners: dict[int, ServiceRunner] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._died_listeners: dict[int, Callable[[ServiceDied], None]] = {}
        self._listener_ids = itertools.count()
        self._throttle = Throttle()
        node.on(CORE_SERVICE, Kind.SERVICE_START, self._on_start)
        node.on(CORE_SERVICE, Kind.SERVICE_STOP, self._on_stop)
        node.on(CORE_SERVICE, Kind.SERVICE_DIED, self._on_died)
        node.set_service_sink(self._deliver)
        self._membership = node.subscribe(self._on_node_event)

    # ------------------------------------------------------------------ starting
    def start_local(self, spec: Spec, owner: NodeId) -> Future:
        """Start a service on this node; the future's result is its ServiceRef."""
        fut: Future = Future()

        def started(outcome: ServiceRef | BaseException) -> None:
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)
        try:
            self._launch(lambda: spec, owner, started)
        except ActorpyError as exc:
            fut.set_exception(exc)
        return fut

    def _on_start(self, msg: wm.Message) -> None:
        """SERVICE_START (I/O thread): a thread for the service at once; the start request
        is decoded and the factory run on that thread, never here or in the task pool."""
        def started(outcome: ServiceRef | BaseException) -> None:
            try:
                if isinstance(outcome, BaseException):
                    self.node.reply_error(msg, outcome)
                else:
                    self.node.reply(msg, outcome, from_service=outcome.service)
            except ActorpyError as exc:
                log.warning("could not answer the start request of %s: %s", msg.sender, exc)
        try:
            # (released as decoded: the start request's arguments, a model's init values
            # say, are not held twice while the service starts)
            self._launch(lambda: msg.payload(release=True), NodeId(msg.sender), started)
        except ActorpyError as exc:
            self.node.reply_error(msg, exc)

    def _launch(self, spec: Callable[[], Spec], owner: NodeId,
                started: Callable[[ServiceRef | BaseException], None]) -> None:
        with self._lock:
            if self._closed:
                raise NodeLost(self.node.node_id, f"node {self.node.node_id} is closing")
            sid = self._ids.allocate()
            runner = ServiceRunner(self, sid, owner, spec, started)
            self._runners[sid] = runner
        runner.thread.start()

    def bind_name(self, name: str, sid: int) -> None:
        """Register ``name`` for service ``sid`` with the manager (runs on its thread)."""
        if not isinstance(name, str) or not 0 < len(name) <= _NAME_MAX:
            raise ActorpyError(f"a service name must be a str of 1 to {_NAME_MAX} characters, "
                               f"not {name!r}")
        if not self._names:
            raise ActorpyError(f"node {self.node.node_id} has no manager to keep service names")
        self.node.call(MANAGER_ID, CORE_SERVICE, Kind.NAME_BIND, (name, sid), timeout_s=30.0,
                       what=f"registration of service name {name!r}")

    def _unbind(self, runner: ServiceRunner) -> None:
        if runner.bound_name:
            name, runner.bound_name = runner.bound_name, ""
            try:
                self.node.send(MANAGER_ID, CORE_SERVICE, Kind.NAME_UNBIND, (name, runner.sid))
            except ActorpyError as exc:
                log.debug("could not release service name %r: %s", name, exc)

    # ------------------------------------------------------------------ stopping
    def stop(self, sid: int, why: str) -> bool:
        """Stop service ``sid``: it finishes what is queued, then its ``close()`` runs;
        messages arriving meanwhile are refused. False if no such service runs here."""
        with self._lock:
            runner = self._runners.pop(sid, None)
        if runner is None:
            return False
        log.info("stopping service %s: %s", runner.label, why)
        runner.reason = f"service {runner.label}{_STOPPED}{why})"
        self._ids.release(sid, runner.reason)
        self._unbind(runner)
        runner.stop()
        return True

    def _on_stop(self, msg: wm.Message) -> None:
        sid = msg.payload()
        stopped = isinstance(sid, int) and self.stop(sid, f"asked by {msg.sender}")
        self.node.reply(msg, stopped)

    def _on_node_event(self, event: NodeEvent) -> None:
        if event.kind is NodeEventKind.JOINED:
            return
        with self._lock:
            orphans = [sid for sid, r in self._runners.items() if r.owner == event.node_id]
        for sid in orphans:
            self.stop(sid, f"the node that started it, {event.node_id}, is gone")

    def close(self) -> None:
        """Stop every service (the node is going; nobody is told)."""
        self._membership.cancel()
        with self._lock:
            self._closed = True
            sids = list(self._runners)
        for sid in sids:
            self.stop(sid, f"node {self.node.node_id} is closing")

    def gone_error(self, reason: str) -> ActorpyError:
        """What a caller of a service that is gone gets: ``NodeLost`` (naming this node)
        once this node is closing, as the node is going away with it; else ServiceDead."""
        if self._closed:
            return NodeLost(self.node.node_id, reason)
        return ServiceDead(reason)

    # ------------------------------------------------------------------ deaths
    def runner_failed(self, runner: ServiceRunner) -> None:
        """The factory failed: the id goes back, nobody knew it."""
        with self._lock:
            self._runners.pop(runner.sid, None)
        self._ids.release(runner.sid)
        self._unbind(runner)

    def runner_died(self, runner: ServiceRunner, reason: str) -> None:
        """A service's thread ended on an error: refuse its id, release its name, tell the
        node that started it."""
        with self._lock:
            self._runners.pop(runner.sid, None)
        self._ids.release(runner.sid, reason)
        self._unbind(runner)
        died = ServiceDied(runner.ref, reason)
        if runner.owner == self.node.node_id:
            self._publish_died(died)
            return
        try:
            self.node.send(runner.owner, CORE_SERVICE, Kind.SERVICE_DIED, died)
        except ActorpyError as exc:
            log.warning("could not tell %s that service %s died: %s", runner.owner,
                        runner.label, exc)

    def _on_died(self, msg: wm.Message) -> None:
        died = msg.payload()
        if not isinstance(died, ServiceDied) or died.ref.node != msg.sender:
            self._throttle.log(log, (msg.sender, "SERVICE_DIED"), "dropped a SERVICE_DIED "
                               "from %s: it names a service it does not host", msg.sender)
            return
        log.error("%s", died.reason)
        self._publish_died(died)

    def on_service_died(self, listener: Callable[[ServiceDied], None]) -> Subscription:
        """Call ``listener(ServiceDied)`` (on the I/O thread) when a service started by this
        node dies."""
        key = next(self._listener_ids)
        self._died_listeners[key] = listener
        return Subscription(self._died_listeners, key)  # type: ignore[arg-type]

    def _publish_died(self, died: ServiceDied) -> None:
        for listener in list(self._died_listeners.values()):
            try:
                listener(died)
            except Exception:
                log.exception("a service-died listener failed on %s", died.ref)

    # ------------------------------------------------------------------ delivery
    def _deliver(self, msg: wm.Message) -> bool:
        """The node's service sink (I/O thread): offer ``msg`` to its service's inbox."""
        sid = msg.header.service
        runner = self._runners.get(sid)
        if runner is None:
            reason = self._ids.reason(sid)
            if reason is None:
                return False  # never heard of it: the node reports an unknown service
            # A cast to a service stopped on purpose (a job ended) is normal: not a warning.
            self._refuse(msg, sid, self.gone_error(reason), quiet=_STOPPED in reason)
            return True
        if runner.run_here(msg):
            return True
        outcome = runner.mailbox.offer(msg, sum(len(f) for f in msg.frames))
        if outcome is Offer.FULL:
            box = runner.mailbox
            self._refuse(msg, sid, ServiceOverloaded(
                f"service {runner.label} is overloaded: its inbox holds {len(box)} items "
                f"(high-water marks {box.max_items} messages / {box.max_bytes} bytes); retry "
                "later or slow down"))
        elif outcome is Offer.CLOSED:
            self._refuse(msg, sid, self.gone_error(runner.reason
                                                   or f"service {runner.label} is stopping"))
        return True

    def _refuse(self, msg: wm.Message, sid: int, exc: Exception, quiet: bool = False) -> None:
        if msg.header.request_id:
            try:
                self.node.reply_error(msg, exc, from_service=sid)
            except ActorpyError as err:
                log.debug("could not refuse a request from %s: %s", msg.sender, err)
            return
        if quiet:
            log.debug("dropped a cast of kind %d from %s: %s", msg.kind, msg.sender, exc)
            return
        self._throttle.log(log, (sid, type(exc)), "dropped a cast of kind %d from %s: %s",
                           msg.kind, msg.sender, exc)

    def running(self) -> list[ServiceRef]:
        """The services running here now."""
        with self._lock:
            return [r.ref for r in self._runners.values()]

    def mailbox(self, sid: int) -> Mailbox | None:
        """Service ``sid``'s inbox (for stats and tests)."""
        runner = self._runners.get(sid)
        return runner.mailbox if runner is not None else None

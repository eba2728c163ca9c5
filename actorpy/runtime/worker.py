"""The generic worker: runs tasks for any engine and hosts long-lived services. It names no
engine: a task is any object with ``run(ctx)``, a service any object with ``handle(msg, ctx)``."""
from __future__ import annotations

import itertools
import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from actorpy.config import Config
from actorpy.ids import NodeId
from actorpy.runtime.context import ServiceRef, WorkerContext, check_service
from actorpy.runtime.membership import Membership
from actorpy.runtime.node import Node
from actorpy.runtime.spill import default_budget_bytes
from actorpy.runtime.store import ObjectStore
from actorpy.wire import message as wm
from actorpy.wire.auth import Security
from actorpy.wire.kinds import CORE_SERVICE, Kind

log = logging.getLogger(__name__)

DRIVER_GONE = "the driver went away"
MANAGER_GONE = "manager stopped answering"
SHUTDOWN = "the manager asked this node to shut down"


class _ServiceRunner:
    """One service, one thread: messages are handled in order, like an actor's mailbox."""

    def __init__(self, service: Any, ctx: WorkerContext, ref: ServiceRef, owner: str) -> None:
        self.service, self.ctx, self.ref, self.owner = service, ctx, ref, owner
        self.inbox: queue.SimpleQueue[wm.Message | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"actorpy-service-{ref.service}")
        self.thread.start()

    def _run(self) -> None:
        while (msg := self.inbox.get()) is not None:
            try:
                self.service.handle(msg, self.ctx)
            except Exception as exc:  # the caller sees it; the service keeps serving
                if msg.header.request_id:
                    self.ctx.reply_error(msg, exc)
                else:
                    log.exception("service %s failed on a message from %s", self.ref, msg.sender)
        close = getattr(self.service, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                log.exception("service %s failed to close", self.ref)

    def stop(self) -> None:
        self.inbox.put(None)


class Worker:
    """A worker process's runtime.

    Args:
        manager_address: where the manager listens.
        bind: this worker's endpoint.
        security, config: as for every node.
        node_id: this worker's id.
    """

    def __init__(self, node_id: NodeId, manager_address: str, bind: str, security: Security,
                 config: Config) -> None:
        self.config = config
        self.node = Node.from_config(node_id, bind, security, config)
        budget = (config.store_budget_bytes if config.store_budget_bytes is not None
                  else default_budget_bytes(config.workers))
        self.store = ObjectStore(budget_bytes=budget, chunk_bytes=self.node.chunk_bytes,
                                 store_dir=config.store_dir, name=node_id)
        self.ctx = WorkerContext(self.node, self.store)
        self.stopped = threading.Event()
        self.stop_reason = ""
        self._executor = ThreadPoolExecutor(config.task_threads,
                                            thread_name_prefix=f"actorpy-task-{node_id}")
        self._services: dict[int, _ServiceRunner] = {}
        self._service_ids = itertools.count(1)
        self.membership = Membership(self.node, manager_address, "worker", config,
                                     self.stop, slots=config.task_threads)
        on = self.node.on
        on(CORE_SERVICE, Kind.TASK, lambda m: self._executor.submit(self._run_task, m))
        on(CORE_SERVICE, Kind.SERVICE_START, lambda m: self._executor.submit(self._start_service, m))
        on(CORE_SERVICE, Kind.SERVICE_STOP, self._stop_service)
        on(CORE_SERVICE, Kind.FETCH, self._fetch)
        self.node.set_service_sink(self._deliver)
        self.node.on_node_lost(self._owner_lost)

    def start(self, timeout_s: float) -> Worker:
        self.node.start()
        self.membership.join(timeout_s)
        log.info("worker %s serving at %s", self.node.node_id, self.node.address)
        return self

    def stop(self, reason: str = "stopped") -> None:
        """Stop services and the loop; safe to call from any thread, more than once."""
        if self.stopped.is_set():
            return
        self.stop_reason = reason
        self.stopped.set()

    def close(self) -> None:
        """Release everything (call from the main thread after ``stopped`` is set).

        When the cluster itself is going (driver or manager gone) there is nobody to say
        goodbye to, so nothing lingers."""
        orphaned = self.stop_reason in (DRIVER_GONE, MANAGER_GONE, SHUTDOWN)
        if not orphaned:
            self.membership.leave()
        for runner in list(self._services.values()):
            runner.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.node.close(linger_ms=0 if orphaned else None)
        self.store.close()

    def _run_task(self, msg: wm.Message) -> None:
        try:
            task = msg.payload()
            result = task.run(self.ctx)
        except BaseException as exc:  # everything a task raises goes back to its caller
            self._answer(msg, exc, failed=True)
            if not isinstance(exc, Exception):
                raise
            return
        self._answer(msg, result, failed=False)

    def _answer(self, msg: wm.Message, value: Any, failed: bool) -> None:
        try:
            if failed:
                self.node.reply_error(msg, value)
            else:
                self.node.reply(msg, value)
        except Exception as exc:  # e.g. the result does not pickle: say so to the caller
            if not failed:
                self.node.reply_error(msg, exc)
            else:
                log.exception("could not report a failure to %s", msg.sender)

    def _start_service(self, msg: wm.Message) -> None:
        try:
            factory, args, kwargs, name = msg.payload()
            service = check_service(factory(self.ctx, *args, **kwargs))
        except Exception as exc:
            self.node.reply_error(msg, exc)
            return
        sid = next(self._service_ids)
        ref = ServiceRef(self.node.node_id, sid, name)
        self._services[sid] = _ServiceRunner(service, self.ctx, ref, msg.sender)
        self.node.reply(msg, ref)

    def _stop_service(self, msg: wm.Message) -> None:
        runner = self._services.pop(msg.payload(), None)
        if runner is not None:
            runner.stop()
        self.node.reply(msg, runner is not None)

    def _deliver(self, msg: wm.Message) -> bool:
        runner = self._services.get(msg.header.service)
        if runner is None:
            return False
        runner.inbox.put(msg)
        return True

    def _owner_lost(self, node_id: NodeId) -> None:
        for sid, runner in list(self._services.items()):
            if runner.owner == node_id:
                log.info("stopping service %s: its owner %s is gone", runner.ref, node_id)
                self._services.pop(sid, None)
                runner.stop()

    def _fetch(self, msg: wm.Message) -> None:
        """Answer a fetch from the store (on the I/O thread: a look-up, nothing unpickled
        or copied; stored blocks are snapshots, so they go out without a reply's copy)."""
        try:
            answer = self.store.serve(msg.payload())
        except Exception as exc:  # no such key, a bad request, a spill file that cannot map
            self.node.reply_error(msg, exc)
            return
        self.node.send(NodeId(msg.sender), CORE_SERVICE, Kind.RESULT, answer,
                       request_id=msg.header.request_id)

"""The generic worker: runs tasks for any engine and hosts long-lived services. It names no
engine: a task is any object with ``run(ctx)``, a service any object with ``handle(msg, ctx)``
(runtime/tasks.py runs the tasks, runtime/host.py the services)."""
from __future__ import annotations

import logging
import threading

from actorpy.config import Config
from actorpy.errors import ConfigError
from actorpy.ids import NodeId
from actorpy.runtime.address import advertised
from actorpy.runtime.host import ServiceHost
from actorpy.runtime.membership import MANAGER_GONE, SHUTDOWN, Membership
from actorpy.runtime.node import Node
from actorpy.runtime.spill import default_budget_bytes
from actorpy.runtime.store import ObjectStore
from actorpy.runtime.tasks import TaskRunner
from actorpy.wire import message as wm
from actorpy.wire.auth import Security
from actorpy.wire.kinds import CORE_SERVICE, Kind

log = logging.getLogger(__name__)

DRIVER_GONE = "the driver went away"


class Worker:
    """A worker process's runtime.

    Args:
        manager_address: where the manager listens.
        bind: this worker's endpoint.
        security, config: as for every node.
        node_id: this worker's id.
        host: the host other nodes dial to reach it, where that is not the bound one (a
            NAT's or a container host's address; ``address.advertised``).
        embedded: started by an embedded cluster, beside its manager: the manager may take
            up to ``config.start_timeout_s`` to listen (``Node.expect_listeners_within``).
    """

    def __init__(self, node_id: NodeId, manager_address: str, bind: str, security: Security,
                 config: Config, *, host: str | None = None, embedded: bool = False) -> None:
        self.config = config
        self.node = Node.from_config(node_id, bind, security, config)
        if embedded:
            self.node.expect_listeners_within(config.start_timeout_s)
        try:
            self.address = advertised(self.node.address, host, manager_address)
        except ConfigError:
            self.node.close()
            raise
        budget = (config.store_budget_bytes if config.store_budget_bytes is not None
                  else default_budget_bytes(config.workers))
        self.store = ObjectStore(budget_bytes=budget, chunk_bytes=self.node.chunk_bytes,
                                 store_dir=config.store_dir, name=node_id)
        self.stopped = threading.Event()
        self.stop_reason = ""
        self.services = ServiceHost(self.node, config, self.store)
        self.tasks = TaskRunner(self.node, self.store, self.services, config.task_threads)
        self.membership = Membership(self.node, manager_address, "worker", config,
                                     self.stop, slots=config.task_threads,
                                     address=self.address)
        self.node.on(CORE_SERVICE, Kind.FETCH, self._fetch)

    def start(self, timeout_s: float) -> Worker:
        self.node.start()
        self.membership.join(timeout_s)
        log.info("worker %s serving at %s", self.node.node_id, self.address)
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
        orphaned = self.stop_reason in (DRIVER_GONE, SHUTDOWN) \
            or self.stop_reason.startswith(MANAGER_GONE)
        if not orphaned:
            self.membership.leave()
        self.services.close()
        self.tasks.close()
        self.node.close(linger_ms=0 if orphaned else None)
        self.store.close()

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

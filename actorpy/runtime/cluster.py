"""The driver's handle on a cluster: ``actorpy.connect()`` returns a ``Cluster``."""
from __future__ import annotations

import functools
import itertools
import logging
import numbers
import os
import random
import signal
import threading
import time
import types
import weakref
from typing import Any, Callable, Iterable

from actorpy import log as alog
from actorpy.config import Config
from actorpy.errors import ActorpyError, ActorpyTimeout, ConfigError, NodeLost
from actorpy.ids import NodeId, new_node_id
from actorpy.runtime.address import node_bind, security_for
from actorpy.runtime.context import Caller, CallTask
from actorpy.runtime.files import ensure_open_files, files_needed
from actorpy.runtime.host import ServiceHost
from actorpy.runtime.local import LocalCluster
from actorpy.runtime.membership import MANAGER_GONE, MANAGER_ID, Membership
from actorpy.runtime.node import Node, NodeEvent, NodeEventKind, Subscription
from actorpy.runtime.reply import ReplyFuture, check_seconds
from actorpy.runtime.stream import StreamTable, TaskStream
from actorpy.runtime.tasks import CancelState, ContextCallTask, StreamTask
from actorpy.wire.auth import Security
from actorpy.wire.kinds import CORE_SERVICE, Kind

log = logging.getLogger(__name__)

#: Workers of an embedded local cluster: its manager spends 3 ZeroMQ sockets per member (a
#: link, its monitor and libzmq's end of it) and about 8 descriptors per worker
#: (files.FILES_PER_WORKER); its context holds as many sockets as the open-files limit
#: allows (files.size_context; at least libzmq's default 1023, about 340 members).
MAX_LOCAL_WORKERS = 256
#: why a terminated cluster's driver refuses every later call
TERMINATED = ("this cluster was terminated (its `with actorpy.connect(...)` block ended, or "
              "terminate() was called); connect again to run more")


def connect(address: str | None = None, *, secret: str | bytes | None = None,
            secret_file: str | None = None, workers: int | None = None,
            config: Config | None = None, log_level: str | None = None,
            **settings: Any) -> Cluster:
    """Connect to a cluster, or start an embedded local one.

    With no ``address`` a manager and ``workers`` worker processes (default: one per core)
    start on this machine, reachable only by this user, and stop when the cluster is
    terminated or this process exits. With ``address`` (``tcp://host:port``) this process
    joins an existing cluster, authenticating with the cluster secret.

    Args:
        address: the manager's endpoint, or None for an embedded local cluster.
        secret, secret_file: the cluster secret (else ``ACTORPY_SECRET``); needed for tcp.
        workers: local worker processes.
        config: a full Config; ``settings`` override single fields (e.g. dead_after_s=2).
        log_level: the embedded cluster's processes' log level (DEBUG, INFO, WARNING,
            ERROR or CRITICAL; default ``ACTORPY_LOG_LEVEL`` or WARNING; an
            ``ACTORPY_LOG_LEVEL`` that is not one of them is a ``ConfigError``).

    Example (tests/test_readme.py runs the same in README.md)::

        import actorpy
        with actorpy.connect(workers=2) as cluster:
            print(cluster.submit(pow, 2, 10).result(timeout=30))   # 1024
    """
    if log_level is not None and (not isinstance(log_level, str)
                                  or log_level.upper() not in alog.LEVELS):
        # before: taken, and each child of the embedded cluster logged at its default
        raise ConfigError(f"log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got "
                          f"{log_level!r}")
    if log_level is not None:
        log_level = log_level.upper()
    elif address is None:   # a bad ACTORPY_LOG_LEVEL would fail each child, unexplained
        log_level = alog.env_level()
    if config is None:
        config = Config.from_env(workers=workers, **settings)
    elif settings or workers is not None:
        raise ConfigError("pass either config= or single settings, not both")
    rng = random.Random(int.from_bytes(os.urandom(8), "big"))
    node_id = new_node_id(rng, "d")
    local: LocalCluster | None = None
    if address is None:
        n = config.workers if config.workers is not None else (os.cpu_count() or 1)
        if n < 1:
            raise ConfigError("an embedded local cluster needs workers >= 1")
        if n > MAX_LOCAL_WORKERS:
            raise too_many_workers(n)
        ensure_open_files(files_needed(n), f"an embedded cluster of {n} workers")
        local = LocalCluster(n, config, log_level)
        security, bind = local.security, local.bind_for(node_id)
        manager_address = local.manager_address
    else:
        ensure_open_files(files_needed(), "a driver")
        security = security_for(address, secret=secret, secret_file=secret_file)
        bind, manager_address = node_bind(address, node_id), address
    try:
        return Cluster(node_id, manager_address, bind, security, config, local)
    except BaseException:
        if local is not None:
            local.close()
        raise


def too_many_workers(n: int) -> ConfigError:
    return ConfigError(
        f"an embedded local cluster takes at most {MAX_LOCAL_WORKERS} workers, not {n}: "
        "its manager holds two sockets per worker, within ZeroMQ's 1023 per process; "
        "for more, run `actorpy manager` and `actorpy worker` on several machines")


def _reap(local: LocalCluster, event: NodeEvent) -> None:
    """A worker of the embedded cluster left or died: collect its exit status at once (a
    killed one stayed a zombie under the driver until the cluster closed)."""
    if event.kind is not NodeEventKind.JOINED and event.node_id in local.worker_ids:
        local.exited([NodeId(event.node_id)])


def exited_before_joining(gone: dict[NodeId, int]) -> str:
    """Words for local workers whose processes ended before they joined: exit status -> how
    (a negative one is the signal that killed it, which leaves no error on stderr: the
    message said there was one after a SIGKILL).

    >>> exited_before_joining({NodeId("w-1"): -9})
    'worker process(es) exited before joining the cluster: w-1 (killed by SIGKILL)'
    """
    def how(code: int) -> str:
        if code >= 0:
            return f"exit status {code}"
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    said = ", ".join(f"{n} ({how(code)})" for n, code in gone.items())
    errors = any(code >= 0 for code in gone.values())
    return ("worker process(es) exited before joining the cluster: " + said
            + ("; their error is on this process's stderr" if errors else ""))


class Cluster(Caller):
    """A driver's connection to a cluster: submit tasks (plain, or streaming items back),
    cancel them, start services on workers or here, look them up, watch membership."""

    def __init__(self, node_id: NodeId, manager_address: str, bind: str, security: Security,
                 config: Config, local: LocalCluster | None) -> None:
        self.config = config
        self.local = local
        self.node = Node.from_config(node_id, bind, security, config)
        if local is not None:   # its manager is a process starting now (expect_listeners...)
            self.node.expect_listeners_within(config.start_timeout_s)
        self._lost = threading.Event()
        self._lost_reason = ""
        self.membership = Membership(self.node, manager_address, "driver", config,
                                     self._manager_lost)
        self._rr = itertools.count()
        # Tasks sent and not yet answered, per worker: where the next task goes.
        self._in_flight: dict[NodeId, int] = {}
        self._load_lock = threading.Lock()
        self._terminated = False
        self._pid = os.getpid()
        # The driver hosts services too (e.g. a collector that tasks cast to) and receives
        # streams (runtime/host.py, runtime/stream.py).
        self.services = ServiceHost(self.node, config)
        self.streams = StreamTable(self.node)
        self.node.start()
        try:
            try:
                self.membership.join(config.start_timeout_s)
            except (ActorpyTimeout, NodeLost) as exc:
                if local is None:
                    raise
                # was "... is `actorpy manager` running there, on that port?"
                raise ActorpyTimeout(local.not_up(config.start_timeout_s)) from exc
            if local is not None:
                self._wait_for_workers(local.worker_ids, config.start_timeout_s)
        except BaseException:
            self.node.close(linger_ms=0)  # nothing worth flushing to a cluster not joined
            raise
        if local is not None:
            self.node.subscribe(functools.partial(_reap, local))
        # Runs at terminate(), when the Cluster is collected, or at interpreter exit.
        self._said_goodbye = [False]   # terminate() says it; else the finalizer does
        self._finalizer = weakref.finalize(self, Cluster._cleanup, self.node, local,
                                           self.services, self._pid, self._said_goodbye)

    @property
    def node_id(self) -> NodeId:
        return self.node.node_id

    # --------------------------------------------------------------- tasks
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> ReplyFuture:
        """Run ``fn(*args, **kwargs)`` on some worker; ``.result(timeout)`` gives its value.

        Raises (from ``result``): RemoteError if it raised there, NodeLost if the worker
        died, ActorpyTimeout (a TimeoutError) when the timeout passes.
        """
        return self.submit_task(CallTask(fn, args, kwargs or None))

    def submit_to(self, node: NodeId, fn: Callable[..., Any], /, *args: Any,
                  **kwargs: Any) -> ReplyFuture:
        """Like ``submit``, on the worker ``node``."""
        return self.submit_task(CallTask(fn, args, kwargs or None), node)

    def submit_task(self, task: Any, node: NodeId | None = None, *,
                    what: str | None = None) -> ReplyFuture:
        """Send an engine's task object (anything with ``run(ctx)``) to ``node``, or to the
        worker with the most free task slots (ties in turn).

        Args:
            what: how errors and timeouts name the task (default: its type or function
                name; never a repr, which could be costly for a task holding data).
        """
        with self._load_lock:
            dest = node if node is not None else self._least_loaded()
            self._in_flight[dest] = self._in_flight.get(dest, 0) + 1
        try:
            fut = self.node.request(dest, CORE_SERVICE, Kind.TASK, task,
                                    what=what or task_name(task))
        except BaseException:
            self._task_done(dest)
            raise
        fut.add_done_callback(lambda _fut: self._task_done(dest))
        return self._cancellable(fut)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], *,
            timeout_s: float) -> list[Any]:
        """``[fn(x) for x in items]``, spread over the workers.

        Raises:
            ActorpyTimeout: not every result came within ``timeout_s`` (one deadline for
                the whole map, counted from the call).
        """
        check_seconds("timeout_s", timeout_s)
        deadline = time.monotonic() + timeout_s
        futures = [self.submit(fn, x) for x in items]
        results = []
        for fut in futures:
            try:
                results.append(fut.result(max(0.0, deadline - time.monotonic())))
            except ActorpyTimeout:
                missing = sum(not f.done() for f in futures)
                raise ActorpyTimeout(
                    f"map of {task_name(CallTask(fn))} over {len(futures)} items: {missing} "
                    f"not done within timeout_s={timeout_s} (the deadline of the whole map); "
                    "raise timeout_s, add workers, or check the workers' logs") from None
        return results

    def _pick_worker(self) -> NodeId:
        """The worker with the most free task slots (ties in turn)."""
        with self._load_lock:
            return self._least_loaded()

    def _least_loaded(self) -> NodeId:
        """(Caller holds ``_load_lock``.) Free slots = the worker's slots minus the tasks
        this driver has in flight there; a busy worker never gets a task while another
        has a slot free."""
        workers = sorted(self.node.peers("worker"), key=lambda p: p.node_id)
        if not workers:
            # (a task that killed its worker took one: an embedded cluster restarts none)
            hint = ("; start more with cluster.add_workers(n)" if self.local is not None
                    else "; start `actorpy worker --manager ...` processes")
            raise NodeLost("-", f"no live workers in this cluster{hint}")
        start = next(self._rr) % len(workers)
        turn = workers[start:] + workers[:start]
        return max(turn, key=lambda p: p.slots - self._in_flight.get(p.node_id, 0)).node_id

    def _task_done(self, dest: NodeId) -> None:
        with self._load_lock:
            left = self._in_flight.get(dest, 0) - 1
            if left > 0:
                self._in_flight[dest] = left
            else:
                self._in_flight.pop(dest, None)

    # --------------------------------------------------------------- workers
    def add_workers(self, n: int, *, timeout_s: float = 60.0) -> list[NodeId]:
        """Start ``n`` more worker processes of the embedded local cluster and wait until
        they joined; returns their ids (they get tasks at once).

        Example::

            with actorpy.connect(workers=1) as cluster:
                new = cluster.add_workers(2, timeout_s=60)   # 3 workers now

        Raises:
            ActorpyError: this cluster is not an embedded one (start ``actorpy worker`` on
                a machine instead), or a new worker exited before joining.
            ActorpyTimeout: they did not all join within ``timeout_s``.
        """
        if self.local is None:
            peer = self.node.peer(MANAGER_ID)
            raise ActorpyError(
                "add_workers starts processes on this machine and works only for an embedded "
                "local cluster (actorpy.connect() with no address); to grow this cluster, run "
                f"`actorpy worker --manager {peer.address if peer else 'tcp://HOST:PORT'} "
                "--secret-file F` on a machine that can reach the manager")
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ConfigError(f"add_workers needs an int n >= 1, not {n!r}")
        check_seconds("timeout_s", timeout_s)
        if len(self.local.worker_ids) + n > MAX_LOCAL_WORKERS:
            raise too_many_workers(len(self.local.worker_ids) + n)
        ids = self.local.add_workers(n)
        self._wait_for_workers(ids, timeout_s)
        return ids

    def _wait_for_workers(self, ids: list[NodeId], timeout_s: float) -> None:
        local = self.local
        assert local is not None

        def joined() -> bool:
            gone = local.exited(ids)
            if gone:
                raise ActorpyError(exited_before_joining(gone))
            return set(ids) <= set(self.workers())
        self.membership.wait_for(joined, timeout_s, f"{len(ids)} local worker(s) to join")

    # --------------------------------------------------------------- streams, cancel
    def submit_stream(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> TaskStream:
        """Run ``fn(ctx, *args, **kwargs)`` on some worker; what it ``ctx.emit``s arrives
        here in order, flow-controlled (Config.stream_window_items / _bytes).

        Example::

            with cluster.submit_stream(lambda ctx, n: [ctx.emit(i) for i in range(n)] and n,
                                       3) as stream:
                items = list(stream)            # [0, 1, 2]
                total = stream.result(10)       # 3
        """
        return self.submit_stream_task(ContextCallTask(fn, args, kwargs or None))

    def submit_stream_task(self, task: Any, node: NodeId | None = None, *,
                           timeout_s: float = 300.0, window_items: int | None = None,
                           window_bytes: int | None = None) -> TaskStream:
        """Send an engine's task (``run(ctx)`` may ``ctx.emit``) as a stream; iterating it
        waits at most ``timeout_s`` per item. Windows default to the Config's.

        Raises:
            ConfigError: a window that is not an int >= 1 (-1 was taken, and the stream
                then failed blaming its worker for overrunning it).
        """
        for name, value in (("window_items", window_items), ("window_bytes", window_bytes)):
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, numbers.Integral) or value < 1):
                raise ConfigError(f"{name} must be an int >= 1 (or None: the Config's), got "
                                  f"{value!r}")
        items = window_items or self.config.stream_window_items
        nbytes = window_bytes or self.config.stream_window_bytes
        dest = node if node is not None else self._pick_worker()
        stream = TaskStream(self.node, self.streams, dest, items, nbytes, timeout_s, self.cancel)
        try:
            fut = self.submit_task(StreamTask(task, stream.stream_id, items, nbytes), dest)
        except BaseException:
            self.streams.remove(stream.stream_id)
            raise
        stream.attach(fut)
        return stream

    def cancel(self, future: ReplyFuture, timeout_s: float = 10.0) -> CancelState:
        """Cancel a submitted task and say where it was: QUEUED (removed, it never runs),
        RUNNING (``ctx.cancelled`` is set there, its next ``emit`` raises TaskCancelled,
        its result is dropped) or FINISHED. ``future`` then raises CancelledError.
        (``future.cancel()`` does the same without waiting for the answer.)"""
        if future.done() and not future.cancelled():
            return CancelState.FINISHED
        state = self.node.call(future.dest, CORE_SERVICE, Kind.CANCEL, future.request_id,
                               timeout_s=timeout_s, what="cancel of a task")
        future.cancel()  # after the request: its own notice then finds nothing left to do
        return CancelState(state)

    def _cancellable(self, fut: ReplyFuture) -> ReplyFuture:
        """``fut.cancel()`` also cancels the task on its worker."""
        def done(f: ReplyFuture) -> None:
            if f.cancelled():
                self.node.forget(f)
                try:
                    self.node.send(f.dest, CORE_SERVICE, Kind.CANCEL, f.request_id)
                except ActorpyError as exc:
                    log.debug("could not send a cancel to %s: %s", f.dest, exc)
        fut.add_done_callback(done)
        return fut

    # --------------------------------------------------------------- membership
    def on_node_lost(self, listener: Callable[[NodeId], None]) -> Subscription:
        """Call ``listener(node_id)`` when a node dies or leaves (from the I/O thread: quick,
        never blocking); ``cancel()`` the returned subscription to stop."""
        return self.node.on_node_lost(listener)

    def subscribe(self, listener: Callable[[NodeEvent], None]) -> Subscription:
        """Call ``listener(event)`` for every membership change: a ``NodeEvent`` with kind
        JOINED, LEFT or DEAD, the node's id, role and the reason (same thread rules)."""
        return self.node.subscribe(listener)

    def nodes(self, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """The manager's table: one dict per node (id, role, state, host, pid, heartbeat age)."""
        return self.node.call(MANAGER_ID, CORE_SERVICE, Kind.LIST_NODES, None,
                              timeout_s=timeout_s, what="node list")

    @property
    def manager_lost(self) -> str | None:
        """Why the manager is gone (its connection down past the death bound), or None while
        it is there: every worker is then lost to this driver too."""
        return self._lost_reason if self._lost.is_set() else None

    def _manager_lost(self, reason: str) -> None:
        if reason.startswith(MANAGER_GONE):
            log.warning("%s: %s", self.node.node_id, reason)
        self._lost_reason = reason
        self._lost.set()
        self.node.mark_dead(MANAGER_ID, reason)
        for peer in self.node.peers():
            self.node.mark_dead(peer.node_id, f"cluster gone: {reason}")

    # --------------------------------------------------------------- lifecycle
    def terminate(self) -> None:
        """Leave the cluster; an embedded local cluster's processes stop too. In a process
        forked from the driver this only forgets the cluster (it is the driver's)."""
        if self._terminated:
            return
        self._terminated = True
        if os.getpid() != self._pid:
            return
        self.membership.leave()
        self._said_goodbye[0] = True
        self._finalizer()

    @staticmethod
    def _cleanup(node: Node, local: LocalCluster | None, services: ServiceHost,
                 pid: int, said_goodbye: list[bool]) -> None:
        if os.getpid() != pid:  # a forked child: its copies of the sockets are not its own
            return
        if local is None and not node.closed and not said_goodbye[0]:
            # a script that ends without terminate(): its manager hears it leave (before, it
            # listed the driver as dead, "the process was killed, stopped or cut off")
            try:
                node.send(MANAGER_ID, CORE_SERVICE, Kind.LEAVE)
            except ActorpyError:
                pass
        services.close()
        node.close(why=TERMINATED)
        if local is not None:
            local.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()

    def __repr__(self) -> str:
        kind = "local" if self.local else "remote"
        return f"<Cluster {kind} driver={self.node_id} workers={len(self.workers())}>"


def task_name(task: Any) -> str:
    """How messages name a task: its function's or its type's qualified name. Cheap, and it
    runs no user code (never a ``repr``, which could render a task's data or raise).

    >>> task_name(CallTask(len)), task_name(CallTask(functools.partial(max, 1)))
    ('task len', 'task max')
    """
    fn = task.fn if isinstance(task, CallTask) else task
    while isinstance(fn, functools.partial):
        fn = fn.func
    if isinstance(fn, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)):
        return f"task {fn.__qualname__}"
    return f"task {type(fn).__qualname__}"


__all__ = ["Cluster", "connect", "ActorpyError"]

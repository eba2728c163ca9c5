"""The handle on a run: ``Run`` starts the server shards and the job's conductor (a service on
the driver, see conductor.py), then waits for the model.

The driver is off the per-step path: workers and shards talk directly. Everything that
happens while the job runs (worker tasks ending, nodes joining or dying, a shard to restart,
workers asking where a restarted shard lives) is handled on the conductor's thread.
"""
from __future__ import annotations

import logging
import math
import numbers
import os
import threading
import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from actorpy.errors import (ActorpyError, ActorpyTimeout, ConfigError, RemoteError,
                            ServiceNameTaken)
from actorpy.ids import NodeId
from actorpy.values import check_model, is_int
from engines.param import checkpoint
from engines.param.aggregate import check_means
from engines.param.errors import CheckpointError, JobFailed
from engines.param.kinds import ParamKind
from engines.param.server import Callbacks, ShardConfig
from engines.param.shell import ShardService, ShardSpec
from engines.param.store import check_init, plan_shards

log = logging.getLogger(__name__)

#: How long the end of a job waits for worker tasks still computing.
GRACE_S = 15.0
#: how long an interrupted ``run`` waits for its job to stop on the cluster (its shards and
#: worker tasks end at their next step; a callback stuck in user code is not waited for)
CANCEL_WAIT_S = 10.0
#: The same for a job that failed (a timeout, most often: its error is due now), and how
#: long collecting each shard's model may take then (a callback may hang on that shard).
FAILED_GRACE_S = 2.0

#: per cluster, worker tasks of ended jobs still running: worker -> [(job, future)]
_LEFTOVERS: weakref.WeakKeyDictionary[Any, dict[NodeId, list[tuple[str, Any]]]] = \
    weakref.WeakKeyDictionary()


def left_running(cluster: Any, job: str, running: Mapping[NodeId, Any]) -> None:
    """A job ended without waiting for these worker tasks (``Conductor._grace_over``): a
    ``push`` or ``data`` that outlived it. The next job's start checks them."""
    left = _LEFTOVERS.setdefault(cluster, {})
    for worker, fut in running.items():
        left.setdefault(worker, []).append((job, fut))


def busy_workers(cluster: Any, pool: list[NodeId]) -> str | None:
    """Why a job on ``pool`` could not run, if some of its workers have every task slot
    taken by a task an ended job left running (None: none has)."""
    left = _LEFTOVERS.get(cluster, {})
    busy: list[str] = []
    for worker in pool:
        tasks = [(job, fut) for job, fut in left.pop(worker, []) if not fut.done()]
        if not tasks:
            continue
        left[worker] = tasks
        peer = cluster.node.peer(worker)
        if len(tasks) >= (peer.slots if peer is not None else 1):
            busy.append(f"{worker} (job {tasks[0][0]!r})")
    if not busy:
        return None
    return (f"worker(s) {', '.join(busy)} still run a task of a job that ended without it: "
            "its push or data outlived that job's timeout_s. This job's tasks would wait "
            "behind it (a worker runs as many tasks at once as its task threads) and time "
            "out; let it return, train on other workers (workers=), or connect() a fresh "
            "cluster")


@dataclass(frozen=True)
class RunOptions:
    servers: int = 1
    timeout_s: float = 600.0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    balance: bool = False
    batch: int = 32
    straggler_factor: float | None = None
    straggler_patience: int = 100
    workers: tuple[NodeId, ...] | None = None
    server_nodes: tuple[NodeId, ...] | None = None
    overlap: bool = False          # workers compute a step ahead (``job.overlaps``)


@dataclass(frozen=True)
class RunStats:
    """What a finished run reports.

    Attributes:
        workers: every worker that took part, in the order they joined.
        steps_per_worker: their steps the server counted (a push that came after the
            stop is not one), in the same order.
        updates: worker updates folded into the model (the most on any shard).
        seconds: training time on the coordinator, from the start barrier to the stop.
        statuses: how each worker ended ("FINISH", "RELEASED", "LOST", "FAILED", or
            "HALTED": stopped because the job failed, timed out or was cancelled).
        restarts: server shards restarted from a checkpoint.
        first_push_wall: wall-clock time of the first push at the coordinator.
        trace: the rows callbacks added with ``store.record`` on every shard (``t`` is
            seconds since that shard's start barrier opened).
        checkpoint_failures: checkpoints the shards could not write (``checkpoint_dir``
            filled up or went away meanwhile, say); each shard's ``checkpoint_error`` and
            ``checkpoint_step`` (its last written) are in ``shards``.
    """

    workers: list[NodeId]
    steps_per_worker: list[int]
    updates: int
    seconds: float
    statuses: dict[NodeId, str]
    restarts: int
    first_push_wall: float | None = None
    shards: list[dict[str, Any]] = field(default_factory=list)
    trace: list[dict[str, float]] = field(default_factory=list)
    checkpoint_failures: int = 0


class Run:
    """A running job (``Job.start``); ``result()`` waits for the model."""

    def __init__(self, job: Any, cluster: Any, init: Mapping[str, Any],
                 options: RunOptions) -> None:
        self.job, self.cluster, self.options = job, cluster, options
        check_model(init)
        if not init:
            raise ConfigError("init must name at least one key")
        check_means(init, job.aggregate)
        check_init(init)
        init = dict(init)
        timeout_s = options.timeout_s
        if not isinstance(timeout_s, numbers.Real) or not 0 < timeout_s < math.inf:
            raise ConfigError(f"need a finite timeout_s > 0, got {options.timeout_s!r}")
        if not (is_int(options.batch) and options.batch >= 1
                and is_int(options.checkpoint_every) and options.checkpoint_every >= 0):
            # NaN pulls between checkpoints never came: the run took none but its first
            raise ConfigError(f"need an int batch >= 1 and an int checkpoint_every >= 0, got "
                              f"batch={options.batch!r} and "
                              f"checkpoint_every={options.checkpoint_every!r}")
        where = options.checkpoint_dir
        if where is not None and (not isinstance(where, (str, os.PathLike))
                                  or not os.fspath(where)):
            # "" was the current directory: checkpoints landed there without a word
            raise ConfigError(f"checkpoint_dir must name a directory (a str or a path), got "
                              f"{where!r}; None takes no checkpoints")
        factor = options.straggler_factor
        if factor is not None and not (isinstance(factor, numbers.Real) and 1 < factor < math.inf):
            # 0 used to turn the policy off without a word (it is false), NaN to fail on the
            # shard: None is the way to say "off"
            raise ConfigError(f"straggler_factor={factor!r}: it must be a finite number > 1 (a "
                              "worker whose time per sample stays above this many times the "
                              "others' median is released), or None for no straggler policy")
        if options.resume and options.checkpoint_dir is None:
            raise ConfigError("resume=True needs checkpoint_dir=")
        self.init = init
        self.key_map = plan_shards(init, options.servers)
        self.checkpoint_dir = (os.path.abspath(options.checkpoint_dir)
                               if options.checkpoint_dir is not None else None)
        #: the shards' refs, by shard index (a restarted shard replaces its entry)
        self.shards: list[Any] = []
        #: the nodes hosting them
        self.hosts: list[NodeId] = []
        self.model: dict[str, Any] | None = None
        self.stats: RunStats | None = None
        self.services_stopped: list[bool] = []
        self.failure: BaseException | None = None
        self.finished = threading.Event()
        self.t0 = time.monotonic()
        self.conductor: Any = None
        self.base_spec: ShardSpec | None = None

    # ----------------------------------------------------------------- public
    def start(self) -> Run:
        from engines.param.conductor import Conductor

        o = self.options
        # Names are unique in the cluster, so a second run would fail at its first shard, in
        # the name service's words ("stop that service first"), which a CLI user cannot do.
        if self.cluster.lookup_async(f"{self.job.name}/shard0").result(
                self.cluster.config.start_timeout_s) is not None:
            raise self.name_taken()
        if self.checkpoint_dir is not None and not o.resume:   # (said once the name is ours:
            # a run refused for a taken name moves nothing)
            first = checkpoint.path_for(self.checkpoint_dir, self.job.name, 0, o.servers)
            if os.path.isfile(first):   # seen from here when the directory is shared
                log.warning("job %r: %s holds an earlier run's checkpoint; this run starts "
                            "from init and keeps it as %s%s (resume=True goes on from a "
                            "checkpoint instead)", self.job.name, first, first,
                            checkpoint.EARLIER)
        live = self.cluster.workers()
        servers_on = o.server_nodes or ()
        if o.server_nodes is not None:
            if not servers_on or any(n not in live for n in servers_on):
                raise ConfigError(f"server_nodes={list(servers_on)} must name live workers of "
                                  "the cluster")
            if o.workers is not None and set(o.workers) & set(servers_on):
                raise ConfigError("a node in server_nodes= hosts shards and does not train: "
                                  "leave it out of workers=")
        pool = [w for w in live if self.trains(w)]
        busy = busy_workers(self.cluster, pool)
        if busy is not None:   # before: it timed out, "check the stop function"
            raise JobFailed(busy)
        if o.workers is not None and len(pool) != len(o.workers):
            raise ConfigError(f"workers={list(o.workers)} are not all live workers of the cluster")
        if not pool:
            raise ConfigError("the cluster has no live workers to train on"
                              + (" besides server_nodes=" if servers_on else ""))
        base = ShardConfig(job=self.job.name, shards=o.servers, policy=self.job.barrier,
                           aggregate=self.job.aggregate, expected=frozenset(pool), batch=o.batch,
                           balance=o.balance, straggler_factor=o.straggler_factor,
                           straggler_patience=o.straggler_patience,
                           checkpoint_every=o.checkpoint_every, seed=self.job.seed,
                           lookahead=int(o.overlap), closed=o.workers is not None)
        self.base_spec = ShardSpec(base, Callbacks(self.job.pull, self.job.schedule,
                                                   self.job.stop),
                                   self.key_map, self.checkpoint_dir, o.resume)
        try:
            # By default on training workers: one that trains beside its shard talks to it
            # without a socket. server_nodes= gives the shards nodes of their own.
            hosts = list(servers_on) or pool
            for i in range(o.servers):
                host = hosts[i % len(hosts)]
                self.shards.append(self.start_shard(i, host, self.base_spec, pool))
                self.hosts.append(host)
            self.conductor = self.cluster.start_service(
                Conductor, self, pool, node=self.cluster.node_id,
                name=f"{self.job.name}/conductor", timeout_s=self.cluster.config.start_timeout_s)
        except RemoteError as exc:   # a refused checkpoint or directory: say it plainly
            self.stop_services()
            if isinstance(exc.__cause__, (CheckpointError, ConfigError)):
                raise exc.__cause__ from None
            if isinstance(exc.__cause__, ServiceNameTaken):   # a run started since the lookup
                raise self.name_taken() from None
            raise
        except BaseException:
            self.stop_services()
            raise
        return self

    def result(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the run to end; the final model (key -> value).

        Raises:
            RemoteError: a callback raised; JobFailed / ActorpyTimeout: see ``Job.run``.
        """
        wait = self.options.timeout_s + 2 * GRACE_S + 30 if timeout_s is None else timeout_s
        try:
            ended = self.finished.wait(min(wait, threading.TIMEOUT_MAX))  # a lock's longest
        except BaseException:
            # Ctrl-C (a notebook's interrupt) while waiting: the job must not go on without
            # its driver, holding the workers' task slots and its name ("already running"
            # to a rerun) until its timeout_s. Before, only Job.run cancelled it.
            self.cancel_and_wait()
            raise
        if not ended:
            raise ActorpyTimeout(f"job {self.job.name!r} still running after {wait} s")
        if self.failure is not None:
            raise self.failure
        assert self.model is not None
        return self.model

    def name_taken(self) -> ConfigError:
        """The error for a job of this name already running on the cluster."""
        name = self.job.name
        err = ConfigError(f"a job named {name!r} is already running on this cluster; wait for "
                          "it to end, or give this one another name")
        err.name_taken = name   # for a command line to word with its flags
        return err

    def trains(self, node: NodeId) -> bool:
        """Whether ``node`` may get a worker task (``workers=``, ``server_nodes=``)."""
        o = self.options
        return ((o.workers is None or node in o.workers)
                and node not in (o.server_nodes or ()))

    def done(self) -> bool:
        return self.finished.is_set()

    def shard_stats(self, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Each shard's live table and counters (steps per worker, updates, ...)."""
        return [self.cluster.call(ref, ParamKind.STATS, timeout_s=timeout_s)
                for ref in list(self.shards)]

    def cancel(self) -> None:
        """Stop the job early (``result()`` then raises JobFailed)."""
        if not self.finished.is_set():
            self.cluster.cast(self.conductor, ParamKind.CANCEL)

    def cancel_and_wait(self) -> None:
        """Cancel the job and wait a while for it to end (best effort: on the way out of an
        interrupt or another error, whose exception stands)."""
        if self.done():
            return
        try:
            self.cancel()
            self.finished.wait(CANCEL_WAIT_S)
        except ActorpyError as exc:   # the cluster gone too
            log.debug("job %s: could not cancel: %s", self.job.name, exc)

    # ----------------------------------------------------------------- shards
    def start_shard(self, i: int, host: NodeId, spec: ShardSpec, expected: Any) -> Any:
        """Start shard ``i`` on ``host``, waiting for ``expected`` workers to join."""
        spec = replace(spec, config=replace(spec.config, shard=i, expected=frozenset(expected)))
        values = {k: v for k, v in self.init.items() if self.key_map[k] == i}
        return self.cluster.start_service(ShardService, spec, values, node=host,
                                          name=f"{self.job.name}/shard{i}",
                                          timeout_s=self.cluster.config.start_timeout_s)

    def stop_services(self) -> None:
        """Stop every shard still running (its host alive); a failed job's waits are short
        (``FAILED_GRACE_S``: a shard may hang in a callback, and the error is due)."""
        wait = 10.0 if self.failure is None else FAILED_GRACE_S
        for ref in self.shards:
            if self.cluster.node.is_dead(ref.node):
                self.services_stopped.append(False)
                continue
            try:
                self.services_stopped.append(self.cluster.stop_service(ref, timeout_s=wait))
            except ActorpyError as exc:
                log.warning("could not stop %s: %s", ref, exc)
                self.services_stopped.append(False)

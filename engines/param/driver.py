"""The driver side of a run: start the server shards, hand a worker task to every worker
(joiners included), follow membership, restart a lost shard from its checkpoint, and collect
the model when the job stops.

The driver is off the per-step path: workers and shards talk directly. Its loop consumes
events that listeners only post (a worker task ended, a node was lost, a worker asks where a
restarted shard lives); new workers are noticed by checking the directory between events.
"""
from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from actorpy.errors import ActorpyError, ActorpyTimeout, ConfigError, NodeLost, RemoteError
from actorpy.ids import NodeId
from engines.param.errors import CheckpointError, JobFailed
from engines.param.kinds import ParamKind, Status
from engines.param.server import Callbacks, ShardConfig
from engines.param.shell import ShardService, ShardSpec
from engines.param.store import family, plan_shards
from engines.param.worker import WorkerResult, WorkerTask

log = logging.getLogger(__name__)

#: How often the loop looks for workers that joined the cluster.
JOIN_CHECK_S = 0.1
#: How long the end of a job waits for worker tasks still computing.
GRACE_S = 15.0


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
    straggler_patience: int = 5
    workers: tuple[NodeId, ...] | None = None


@dataclass(frozen=True)
class RunStats:
    """What a finished run reports.

    Attributes:
        workers: every worker that took part, in the order they joined.
        steps_per_worker: their steps the server counted (a push that came after the
            stop is not one), in the same order.
        updates: worker updates folded into the model (the most on any shard).
        seconds: training time on the coordinator, from the start barrier to the stop.
        statuses: how each worker ended ("FINISH", "RELEASED", "LOST", "FAILED").
        restarts: server shards restarted from a checkpoint.
        first_push_wall: wall-clock time of the first push at the coordinator.
        trace: the rows callbacks added with ``store.record`` on every shard (``t`` is
            seconds since that shard's start barrier opened).
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


class Run:
    """A running job (``Job.start``); ``result()`` waits for the model."""

    def __init__(self, job: Any, cluster: Any, init: dict[str, Any], options: RunOptions) -> None:
        self.job, self.cluster, self.options = job, cluster, options
        if not init:
            raise ConfigError("init must name at least one key")
        for key, value in init.items():
            if not isinstance(key, str) or family(value) is None:
                raise ConfigError(f"init[{key!r}]: keys are strings and values numpy arrays or "
                                  "torch tensors")
        if options.timeout_s <= 0 or options.batch < 1 or options.checkpoint_every < 0:
            raise ConfigError("need timeout_s > 0, batch >= 1 and checkpoint_every >= 0")
        if options.resume and options.checkpoint_dir is None:
            raise ConfigError("resume=True needs checkpoint_dir=")
        self.init = init
        self.key_map = plan_shards(init, options.servers)
        self.checkpoint_dir = (os.path.abspath(options.checkpoint_dir)
                               if options.checkpoint_dir is not None else None)
        self.shards: list[Any] = []
        self.model: dict[str, Any] | None = None
        self.stats: RunStats | None = None
        self.services_stopped: list[bool] = []
        self._events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._done = threading.Event()
        self._failure: BaseException | None = None
        self._control = 0x8000 + secrets.randbelow(0x7FFF)
        self._generation = 0
        self._parked: list[Any] = []
        self._running: dict[NodeId, Any] = {}
        self._order: list[NodeId] = []
        self._seen: set[NodeId] = set()
        self._slots: dict[NodeId, int] = {}
        self._free_slots: list[int] = []
        self._results: dict[NodeId, WorkerResult] = {}
        self._statuses: dict[NodeId, str] = {}
        self._stopped = False
        self._halted = False
        self._restarts = 0
        self._t0 = time.monotonic()
        self._subscription: Any = None
        self._warned_empty = False

    # ----------------------------------------------------------------- public
    def start(self) -> Run:
        o = self.options
        live = self.cluster.workers()
        pool = [w for w in live if o.workers is None or w in o.workers]
        if o.workers is not None and len(pool) != len(o.workers):
            raise ConfigError(f"workers={list(o.workers)} are not all live workers of the cluster")
        if not pool:
            raise ConfigError("the cluster has no live workers to train on")
        self._slots_total = len(pool)
        base = ShardConfig(job=self.job.name, shards=o.servers, policy=self.job.barrier,
                           aggregate=self.job.aggregate, expected=frozenset(pool), batch=o.batch,
                           balance=o.balance, straggler_factor=o.straggler_factor,
                           straggler_patience=o.straggler_patience,
                           checkpoint_every=o.checkpoint_every, seed=self.job.seed)
        self._base_spec = ShardSpec(base, Callbacks(self.job.pull, self.job.schedule, self.job.stop),
                                    self.key_map, self.checkpoint_dir, o.resume)
        self._hosts: list[NodeId] = []
        try:
            for i in range(o.servers):
                host = pool[i % len(pool)]
                self.shards.append(self._start_shard(i, host, self._base_spec, pool))
                self._hosts.append(host)
        except RemoteError as exc:   # a refused checkpoint or directory: say it plainly
            self._stop_services()
            if isinstance(exc.__cause__, (CheckpointError, ConfigError)):
                raise exc.__cause__ from None
            raise
        except BaseException:
            self._stop_services()
            raise
        self.cluster.node.on(self._control, ParamKind.SHARDS,
                             lambda msg: self._events.put(("control", msg)))
        self._subscription = self.cluster.on_node_lost(lambda n: self._events.put(("lost", n)))
        for w in pool:
            self._submit(w)
        threading.Thread(target=self._loop, daemon=True, name=f"param-{self.job.name}").start()
        return self

    def result(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the run to end; the final model (key -> value).

        Raises:
            RemoteError: a callback raised; JobFailed / ActorpyTimeout: see ``Job.run``.
        """
        wait = self.options.timeout_s + 2 * GRACE_S + 30 if timeout_s is None else timeout_s
        if not self._done.wait(wait):
            raise ActorpyTimeout(f"job {self.job.name!r} still running after {wait} s")
        if self._failure is not None:
            raise self._failure
        assert self.model is not None
        return self.model

    def done(self) -> bool:
        return self._done.is_set()

    def shard_stats(self, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Each shard's live table and counters (steps per worker, updates, ...)."""
        return [self.cluster.call(ref, ParamKind.STATS, timeout_s=timeout_s)
                for ref in list(self.shards)]

    def cancel(self) -> None:
        """Stop the job early (``result()`` then raises JobFailed)."""
        self._events.put(("cancel",))

    # ----------------------------------------------------------------- the loop
    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as exc:   # report whatever broke the loop to result()
            log.exception("parameter-server driver loop of %s failed", self.job.name)
            self._failure = self._failure or exc
        finally:
            try:
                self._finish()
            finally:
                if self._subscription is not None and hasattr(self._subscription, "cancel"):
                    self._subscription.cancel()
                self._done.set()

    def _serve(self) -> None:
        deadline = self._t0 + self.options.timeout_s
        grace_end: float | None = None
        while True:
            ending = self._stopped or self._failure is not None
            if ending and not self._running:
                return
            now = time.monotonic()
            if ending:
                grace_end = grace_end or now + GRACE_S
                if now > grace_end:
                    log.warning("job %s: %d worker tasks still busy after the stop; not "
                                "waiting for them", self.job.name, len(self._running))
                    return
            elif not self._running and self.options.workers is not None:
                self._fail(JobFailed(f"every worker of job {self.job.name!r} was lost "
                                     f"({', '.join(self._order)})"))
                continue
            elif not self._running and not self._warned_empty:
                self._warned_empty = True
                log.warning("job %s: no worker left; waiting for workers to join until the "
                            "job's timeout", self.job.name)
            elif now > deadline:
                self._fail(ActorpyTimeout(
                    f"job {self.job.name!r} did not reach its stop condition within "
                    f"timeout_s={self.options.timeout_s}; raise it, or check the stop "
                    "function and the workers' logs"))
                continue
            try:
                event = self._events.get(timeout=JOIN_CHECK_S)
            except queue.Empty:
                event = None
            if event is not None:
                self._on_event(event)
            if not ending and self.options.workers is None:
                for w in self.cluster.workers():
                    if w not in self._seen:
                        log.info("job %s: worker %s joined; giving it a task", self.job.name, w)
                        self._submit(w)

    def _on_event(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "task":
            self._task_ended(event[1], event[2])
        elif kind == "lost":
            self._node_lost(event[1])
        elif kind == "control":
            self._parked.append(event[1])
            self._answer_control()
        elif kind == "cancel":
            self._fail(JobFailed(f"job {self.job.name!r} was cancelled"))

    def _task_ended(self, worker: NodeId, fut: Any) -> None:
        if self._running.pop(worker, None) is None:
            return
        try:
            result: WorkerResult = fut.result(0)
        except NodeLost:
            self._statuses[worker] = "LOST"
            self._free_slots.append(self._slots[worker])
        except Exception as exc:
            self._statuses[worker] = "FAILED"
            self._fail(exc)
        else:
            self._results[worker] = result
            self._statuses[worker] = result.status.name
            if result.status == Status.FINISH:
                self._stopped = True
                self._halt_shards()
            elif result.status == Status.RELEASED:
                log.warning("job %s: worker %s released as a persistent straggler",
                            self.job.name, worker)
                self._free_slots.append(self._slots[worker])
        self._cast_all(ParamKind.LEAVE, worker)

    def _node_lost(self, node: NodeId) -> None:
        for i, host in enumerate(self._hosts):
            if host == node and self._failure is None and not self._stopped:
                self._restart_shard(i)

    # ----------------------------------------------------------------- shards
    def _start_shard(self, i: int, host: NodeId, spec: ShardSpec, expected: Any) -> Any:
        spec = replace(spec, config=replace(spec.config, shard=i, expected=frozenset(expected)))
        values = {k: v for k, v in self.init.items() if self.key_map[k] == i}
        return self.cluster.start_service(ShardService, spec, values, node=host,
                                          name=f"{self.job.name}/shard{i}",
                                          timeout_s=self.cluster.config.start_timeout_s)

    def _restart_shard(self, i: int) -> None:
        if self.checkpoint_dir is None:
            self._fail(JobFailed(f"server shard {i} of job {self.job.name!r} was lost with its "
                                 f"node {self._hosts[i]} and there is no checkpoint to restart "
                                 "it from; pass checkpoint_dir= (and checkpoint_every=) to "
                                 "survive this"))
            return
        live = [w for w in self.cluster.workers() if w != self._hosts[i]]
        spare = [w for w in live if w not in self._hosts] or live
        if not spare:
            self._fail(JobFailed(f"server shard {i} was lost and no live worker can host it"))
            return
        log.warning("job %s: server shard %d lost with %s; restarting it on %s from %s",
                    self.job.name, i, self._hosts[i], spare[0], self.checkpoint_dir)
        spec = replace(self._base_spec, resume=True)
        try:
            self.shards[i] = self._start_shard(i, spare[0], spec, list(self._running))
        except ActorpyError as exc:
            self._fail(JobFailed(f"server shard {i} was lost and could not be restarted on "
                                 f"{spare[0]} ({exc}); workers need a free task thread to host "
                                 "a shard (`actorpy worker --threads 2`, or task_threads=2)"))
            return
        self._hosts[i] = spare[0]
        self._restarts += 1
        self._generation += 1
        self._answer_control()

    def _answer_control(self) -> None:
        """Answer workers asking for a newer shard directory, when there is one."""
        keep = []
        for msg in self._parked:
            if self._failure is not None:
                self.cluster.node.reply(msg, (None, ()))
            elif msg.payload() < self._generation:
                self.cluster.node.reply(msg, (self._generation, tuple(self.shards)))
            else:
                keep.append(msg)
        self._parked = keep

    # ----------------------------------------------------------------- helpers
    def _submit(self, worker: NodeId) -> None:
        o = self.options
        self._seen.add(worker)
        slot = (self._free_slots.pop(0) if self._free_slots
                else max(self._slots.values(), default=-1) + 1)
        self._slots[worker] = slot
        left = max(1.0, self._t0 + o.timeout_s - time.monotonic())
        task = WorkerTask(self.job.push, self.job.data, tuple(self.shards), self.key_map,
                          self.cluster.node_id, self._control, self._generation, slot,
                          self._slots_total, self.job.seed, o.batch, left)
        fut = self.cluster.submit_task(task, worker)
        self._running[worker] = fut
        self._order.append(worker)
        fut.add_done_callback(lambda f, w=worker: self._events.put(("task", w, f)))

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        self._halt_shards()
        self._answer_control()

    def _halt_shards(self) -> None:
        if not self._halted:
            self._halted = True
            self._cast_all(ParamKind.HALT, None)

    def _cast_all(self, kind: int, payload: Any) -> None:
        for ref in self.shards:
            if not self.cluster.node.is_dead(ref.node):
                try:
                    self.cluster.cast(ref, kind, payload)
                except ActorpyError as exc:
                    log.debug("could not tell shard %s: %s", ref, exc)

    def _finish(self) -> None:
        model: dict[str, Any] = {}
        shard_stats: list[dict[str, Any]] = []
        for i, ref in enumerate(self.shards):
            try:
                model.update(self.cluster.call(ref, ParamKind.MODEL, True, timeout_s=30))
                shard_stats.append(self.cluster.call(ref, ParamKind.STATS, timeout_s=30))
            except ActorpyError as exc:
                log.warning("job %s: could not collect shard %d: %s", self.job.name, i, exc)
                if self._failure is None:
                    self._failure = JobFailed(f"could not collect server shard {i}: {exc}")
        self._stop_services()
        self.model = model
        coordinator = shard_stats[0] if shard_stats else {}
        history = coordinator.get("history", {})
        steps = [self._results[w].steps if w in self._results else history.get(w, 0)
                 for w in self._order]
        trace = sorted((row for s in shard_stats for row in s.get("trace", [])),
                       key=lambda row: row["t"])
        self.stats = RunStats(list(self._order), steps,
                              max((s["updates"] for s in shard_stats), default=0),
                              float(coordinator.get("train_seconds") or 0.0),
                              dict(self._statuses), self._restarts,
                              coordinator.get("first_push_wall"), shard_stats, trace)

    def _stop_services(self) -> None:
        for ref in self.shards:
            if self.cluster.node.is_dead(ref.node):
                self.services_stopped.append(False)
                continue
            try:
                self.services_stopped.append(self.cluster.stop_service(ref))
            except ActorpyError as exc:
                log.warning("could not stop %s: %s", ref, exc)
                self.services_stopped.append(False)

"""Running one action: stages in dependency order, tasks on free worker slots, a BSP barrier
between stages, and recomputation from lineage when workers die.

A stage is done when ``BSP().decide`` lets its partitions advance past it: every partition
has completed the stage. ``_ensure`` makes that true: it first ensures the shuffles the
stage reads (recursively), then runs the stage's missing partitions. When a worker dies
its outputs (map outputs, cached partitions) simply become missing again, so the same loop
recomputes exactly what was lost, from the plan, on the workers that are left.
"""
from __future__ import annotations

import logging
import time
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from actorpy.barrier import BSP, FullView
from actorpy.errors import ActorpyTimeout, NodeLost, RemoteError
from actorpy.ids import NodeId
from engines.mapre import plan as P
from engines.mapre.engine import Engine
from engines.mapre.errors import ArgumentError, FetchFailed, JobFailed, check_timeout
from engines.mapre.partition import range_bounds
from engines.mapre.progress import Progress, wanted
from engines.mapre.shuffle import Block, ShuffleSpec
from engines.mapre.tasks import (NarrowSpec, PartitionTask, ReadCached, ReadItems, ReadShuffle,
                                 ReadSplits, SampleKeys, TaskOutcome, WriteCache, WriteShuffle)

log = logging.getLogger(__name__)

#: Tries per partition and stage before the job gives up (lost workers, failed fetches).
MAX_ATTEMPTS = 4
#: Tasks queued on a worker beyond its slots, to hide the round trip between tasks.
QUEUED_PER_WORKER = 1
#: how long a job given up (timeout, Ctrl-C) waits, in all, for its workers to confirm that
#: its tasks are cancelled (they answer in milliseconds; a worker that does not is only told)
CANCEL_CONFIRM_S = 2.0
#: Sort keys sampled per partition and per output partition, for range bounds.
SAMPLES_PER_PARTITION = 20

Key = tuple[int, int]  # (side, partition)
_DONE, _RETRY, _INPUT_LOST = "done", "retry", "input lost"
_RESULT = 0  # the action's own stage, among the readers of a shuffle
Build = Callable[[Key], tuple[Any, Any, list[Any]]]


class MissingInput(Exception):
    """A map output a task needs is gone (its worker died): recompute before dispatching."""


@dataclass
class Stage:
    """One stage of this job: its tasks' keys and, once done, where each output is."""

    id: int
    name: str
    inputs: tuple[P.Node, ...]
    keys: list[Key]
    outputs: dict[Key, tuple[NodeId, TaskOutcome]] = field(default_factory=dict)
    attempts: Counter[Key] = field(default_factory=Counter)
    #: Takes each output's value on the driver as it arrives (then held by the driver).
    consume: Callable[[int, TaskOutcome], None] | None = None

    def waiting_on(self) -> tuple[NodeId, ...]:
        """The barrier over this stage's partitions: who has not completed it yet."""
        table = {NodeId(f"{side}.{part}"): int((side, part) in self.outputs)
                 for side, part in self.keys}
        return BSP().decide(1, FullView(table)).waiting_on


class Job:
    """One action's run. Use as a context manager: leaving deletes the job's blocks.

    Args:
        engine: the cluster's engine state.
        action: the action's name, for messages.
        final: the plan node the action reads.
        timeout_s: the whole action's time limit.
        progress: see ``progress.wanted``.
    """

    def __init__(self, engine: Engine, action: str, final: P.Node, timeout_s: float,
                 progress: bool | None) -> None:
        self.engine = engine
        self.action = action
        self.id = engine.new_job_id()
        self.prefix = f"mapre/{self.id}"
        self.timeout_s = check_timeout(timeout_s, action)
        self.deadline = time.monotonic() + timeout_s
        self.progress = Progress(action, wanted(progress), P.count_stages(final))
        self._stage_ids = iter(range(1, 1 << 30))
        self._map_stages: dict[int, Stage] = {}
        self._bounds: dict[int, tuple[Any, ...]] = {}
        self._result_stages: list[Stage] = []
        self._caches: dict[int, P.Cache] = {}      # handle -> cache (user caches and shadows)
        self._shadows: dict[int, P.Cache] = {}     # id(job-scoped cache node) -> this job's copy
        self._user_caches = [n for n in P.walk(final)
                             if isinstance(n, P.Cache) and not n.job_scoped]
        self.suspects: set[NodeId] = set()
        self._absorbed: set[NodeId] = set()
        self.stored_on: set[NodeId] = set()
        self._consumers: dict[int, set[int]] | None = None
        self._completed: set[int] = set()
        #: Tasks were left running when the job failed (see ``_abandon``).
        self.abandoned = False
        #: the last loss of a worker that ran this job's tasks: (stage, reason, the
        #: partitions it was running), for the error once no worker is left
        self._last_loss: tuple[str, str, list[int]] = ("", "", [])

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.close()
        if self.stored_on:  # wait for it, but never beyond the action's own time limit,
            # nor behind abandoned tasks still running
            left = min(5.0, self.deadline - time.monotonic())
            self.engine.delete(self.stored_on, (self.prefix + "/",),
                               wait_s=left if left > 0 and not self.abandoned else None)

    # ---------------------------------------------------------------- entry points
    def run(self, node: P.Node, name: str, sink_for: Callable[[int], Any],
            parts: list[int] | None = None, release: bool = True,
            consume: Callable[[int, TaskOutcome], None] | None = None) -> Stage:
        """Run a result stage over ``parts`` of ``node`` (default: all); every output is
        in ``stage.outputs[(0, part)]`` when it returns. With ``release`` the shuffle
        blocks it read are deleted right away (pass False to run more parts later). With
        ``consume`` each output's value goes to ``consume(part, outcome)`` as soon as its
        task is back, once, and is not kept (so a worker lost later costs nothing)."""
        if self._consumers is None:
            self._consumers = P.shuffle_readers(node, _RESULT)
        parts = list(range(node.partitions)) if parts is None else parts
        stage = Stage(next(self._stage_ids), name, (node,), [(0, p) for p in parts],
                      consume=consume)
        self._result_stages.append(stage)
        self._ensure(stage, lambda key: self._build(node, key[1], sink_for(key[1])))
        if release:
            self._completed.add(_RESULT)
            self._release_inputs()
        return stage

    def rerun(self, stage: Stage, part: int, sink_for: Callable[[int], Any]) -> None:
        """Compute one result partition again (its stored output was lost)."""
        stage.outputs.pop((0, part), None)
        node = stage.inputs[0]
        self._ensure(stage, lambda key: self._build(node, key[1], sink_for(key[1])))

    def left_s(self) -> float:
        """Seconds left before the action's timeout (raises once it has passed)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ActorpyTimeout(f"{self.action} did not finish within {self.timeout_s} s; "
                                 "pass a larger timeout_s (or check the workers' logs)")
        return left

    # ---------------------------------------------------------------- stages
    def _ensure(self, stage: Stage, build: Build) -> None:
        while True:
            self._absorb_losses()
            if not stage.waiting_on():  # the barrier opens: the next stage may start
                return
            for shuffle in P.unique_shuffles(s for n in stage.inputs for s in P.input_shuffles(n)):
                self._ensure_shuffle(shuffle)
            missing = [k for k in stage.keys if k not in stage.outputs]
            self._run_tasks(stage, missing, build)

    def _map_stage(self, shuffle: P.Shuffle) -> Stage:
        stage = self._map_stages.get(id(shuffle))
        if stage is None:
            keys = [(side, p) for side, parent in enumerate(shuffle.parents)
                    for p in range(parent.partitions)]
            stage = Stage(next(self._stage_ids), f"{shuffle.label()} (map side)",
                          shuffle.parents, keys)
            self._map_stages[id(shuffle)] = stage
        return stage

    def _ensure_shuffle(self, shuffle: P.Shuffle) -> None:
        stage = self._map_stage(shuffle)
        if not stage.waiting_on():
            return
        if shuffle.kind is P.ShuffleKind.SORT_BY and id(shuffle) not in self._bounds:
            self._bounds[id(shuffle)] = self._sample_bounds(shuffle)
        spec = self._shuffle_spec(shuffle)

        def build(key: Key) -> tuple[Any, Any, list[Any]]:
            side, part = key
            sink = WriteShuffle(spec, f"{self.prefix}/s{stage.id}/{side}/{part}", part)
            return self._build(shuffle.parents[side], part, sink)
        self._ensure(stage, build)
        self._completed.add(id(shuffle))
        self._release_inputs()

    def _release_inputs(self) -> None:
        """Delete the blocks of every shuffle whose readers in this job have all finished
        (if one is needed again after a loss, it is recomputed like any lost output)."""
        for sid, stage in self._map_stages.items():
            readers = (self._consumers or {}).get(sid)
            if stage.outputs and readers is not None and readers <= self._completed:
                holders = {w for w, _ in stage.outputs.values()}
                stage.outputs.clear()
                self.engine.delete(holders, (f"{self.prefix}/s{stage.id}/",), wait_s=None)

    def _sample_bounds(self, shuffle: P.Shuffle) -> tuple[Any, ...]:
        """sort_by's first pass: compute (and keep) each input partition, sample its keys."""
        source = shuffle.parents[0]
        size = SAMPLES_PER_PARTITION * shuffle.partitions
        stage = Stage(next(self._stage_ids), "sort_by (sample)", (source,),
                      [(0, p) for p in range(source.partitions)])

        def build(key: Key) -> tuple[Any, Any, list[Any]]:
            sink = SampleKeys(shuffle.fn, size, seed=key[1])
            return self._build(source, key[1], sink, store_job_cache=True)
        self._ensure(stage, build)
        samples = []
        for _, outcome in stage.outputs.values():
            count, keys = outcome.value
            samples.extend((k, count / len(keys)) for k in keys)
        try:
            return tuple(range_bounds(samples, shuffle.partitions))
        except TypeError as exc:   # before: the bare TypeError from deep in the driver
            raise ArgumentError(f"stage 'sort_by (sample)': the sort keys do not compare with "
                                f"each other ({exc}); sort_by needs keys of one orderable kind "
                                "(None among ints: key=lambda x: (x is None, x))") from None

    def _shuffle_spec(self, shuffle: P.Shuffle) -> ShuffleSpec:
        return ShuffleSpec(shuffle.kind, shuffle.partitions, shuffle.fn, shuffle.ascending,
                           self._bounds.get(id(shuffle), ()))

    # ---------------------------------------------------------------- specs
    def _build(self, node: P.Node, part: int, sink: Any,
               store_job_cache: bool = False) -> tuple[Any, Any, list[Any]]:
        """The task for one partition: (spec, sink, reads) where ``reads`` lists the
        (cache, part, holder) stored partitions it reads, for locality."""
        reads: list[Any] = []
        spec = self._spec(node, part, reads, store_job_cache)
        return spec, sink, reads

    def _spec(self, node: P.Node, part: int, reads: list[Any], store_job_cache: bool) -> Any:
        if isinstance(node, P.Narrow):
            return NarrowSpec(self._spec(node.parent, part, reads, False), node.ops)
        if isinstance(node, P.TextSource):
            return ReadSplits(node.splits[part], node.errors, node.raw, node.cut_long_lines)
        if isinstance(node, P.ItemsSource):
            return ReadItems(node.chunks[part])
        if isinstance(node, P.Union):
            parent, sub = node.locate(part)
            return self._spec(parent, sub, reads, False)
        if isinstance(node, P.Cache) and node.disabled:
            return self._spec(node.parent, part, reads, False)
        if isinstance(node, P.Cache):
            cache = self._cache(node)
            where = cache.where(part)
            if where is not None:
                reads.append((cache, part, where[0]))
                return ReadCached(where[0], cache.key(part), where[1], consume=node.job_scoped)
            child = self._spec(node.parent, part, reads, False)
            if node.job_scoped and not store_job_cache:
                return child
            return WriteCache(child, cache.key(part), id(cache), part)
        if isinstance(node, P.Shuffle):
            stage = self._map_stage(node)
            sides = []
            for side, parent in enumerate(node.parents):
                blocks = []
                for p in range(parent.partitions):
                    out = stage.outputs.get((side, p))
                    if out is None:
                        raise MissingInput(f"map output {side}.{p} of stage {stage.id}")
                    holder, outcome = out
                    chunks = outcome.value[part]
                    if chunks:
                        blocks.append(Block(holder, f"{self.prefix}/s{stage.id}/{side}/{p}/{part}",
                                            chunks))
                sides.append(tuple(blocks))
            return ReadShuffle(self._shuffle_spec(node), tuple(sides))
        raise TypeError(f"unknown plan node {type(node).__name__}")

    def _cache(self, node: P.Cache) -> P.Cache:
        if not node.job_scoped:
            self._caches[id(node)] = node
            return node
        shadow = self._shadows.get(id(node))
        if shadow is None:
            shadow = P.Cache(node.parent, f"{self.prefix}/c{len(self._shadows)}", job_scoped=True)
            self._shadows[id(node)] = shadow
            self._caches[id(shadow)] = shadow
        return shadow

    # ---------------------------------------------------------------- tasks
    def _run_tasks(self, stage: Stage, keys: list[Key], build: Build) -> None:
        """Run ``keys`` of ``stage`` until each succeeded, or until an input turned out to
        be lost (then return once the running tasks are back; ``_ensure`` recomputes)."""
        self.progress.stage(stage.name, len(keys))
        pending = deque(keys)
        inflight: dict[Any, tuple[Key, NodeId, list[Any]]] = {}
        load: Counter[NodeId] = Counter()
        broken = False
        try:
            while inflight or (pending and not broken):
                self._absorb_losses()
                if pending and not broken:
                    broken = self._dispatch(stage, pending, inflight, load, build)
                if not inflight:
                    if pending and not broken:
                        manager = getattr(self.engine.cluster, "manager_lost", None)
                        if manager:   # the workers went with it: say so first
                            raise JobFailed(f"{self.action}: the cluster's manager is gone "
                                            f"({manager}) while running stage "
                                            f"'{stage.name}'; restart it and reconnect")
                        last = self._last_loss_said()
                        raise JobFailed(f"{self.action}: no live workers left to run stage "
                                        f"'{stage.name}'{last}; start workers or reconnect")
                    break
                done, _ = wait(list(inflight), timeout=min(0.25, self.left_s()),
                               return_when=FIRST_COMPLETED)
                for fut in done:
                    key, worker, reads = inflight.pop(fut)
                    load[worker] -= 1
                    status = self._settle(stage, key, worker, reads, fut)
                    if status is not _DONE:
                        pending.append(key)
                        broken = broken or status is _INPUT_LOST
        except BaseException as exc:
            # a user's error: wait for the others; a timeout or Ctrl-C: give up at once
            patient = isinstance(exc, Exception) and not isinstance(exc, TimeoutError)
            self._abandon(inflight, wait_s=10.0 if patient else 0.0)
            raise

    def _abandon(self, inflight: dict[Any, Any], wait_s: float) -> None:
        """The job fails: let running tasks finish (up to ``wait_s``) so that the blocks they
        store are deleted with the job's. With ``wait_s`` 0 (a timeout, Ctrl-C) the tasks
        are cancelled instead (their workers confirm it, ``CANCEL_CONFIRM_S`` at most): queued
        ones never start, running ones stop at their next block of input (a thread cannot be
        stopped: one in user code goes on) and what they store stays until the cluster
        ends."""
        for _, worker, _ in inflight.values():
            self.stored_on.add(worker)
        if inflight and wait_s > 0:
            wait(list(inflight), timeout=min(wait_s, max(0.0, self.deadline - time.monotonic())))
        elif inflight:
            self.abandoned = True
            self.engine.cancel(list(inflight), CANCEL_CONFIRM_S)

    def _dispatch(self, stage: Stage, pending: deque[Key], inflight: dict[Any, Any],
                  load: Counter[NodeId], build: Build) -> bool:
        """Start pending tasks on free slots; True if an input is missing (stage broken)."""
        workers = [w for w in self.engine.workers() if w not in self.suspects]
        free = {w: self.engine.slots(w) + QUEUED_PER_WORKER - load[w] for w in workers}
        while pending and any(n > 0 for n in free.values()):
            key = pending.popleft()
            try:
                spec, sink, reads = build(key)
            except MissingInput as exc:
                log.info("%s: stage %s needs %s again", self.id, stage.name, exc)
                pending.appendleft(key)
                return True
            holders = [r[2] for r in reads if free.get(r[2], 0) > 0]
            target = holders[0] if holders else max(free, key=lambda w: (free[w], -load[w]))
            task = PartitionTask(stage.name, key[1], spec, sink, fetch_timeout_s=self.left_s())
            inflight[self.engine.submit(task, target)] = (key, target, reads)
            load[target] += 1
            free[target] -= 1
        return False

    def _settle(self, stage: Stage, key: Key, worker: NodeId, reads: list[Any], fut: Any) -> str:
        """Take a finished task's result: _DONE, _RETRY (its worker died) or _INPUT_LOST
        (a block it read is gone: recompute that first)."""
        try:
            outcome: TaskOutcome = fut.result(0)
        except NodeLost as exc:
            self.suspects.add(worker)
            self._retry(stage, key, f"worker {worker} was lost ({exc})")
            return _RETRY
        except RemoteError as exc:
            cause = exc.__cause__
            if not isinstance(cause, FetchFailed):
                raise self._user_error(stage, key, exc) from cause
            self.suspects.add(NodeId(cause.node))
            self._retry(stage, key, str(cause))
            return _INPUT_LOST
        if stage.consume is None:
            stage.outputs[key] = (worker, outcome)
        else:  # taken here: the driver holds it now, a loss of the worker does not undo it
            stage.consume(key[1], outcome)
            stage.outputs[key] = (NodeId(self.engine.owner), replace(outcome, value=None))
        self.stored_on.add(worker)
        for handle, part, chunks in outcome.cached:
            self._caches[handle].record(part, worker, chunks)
        for cache, part, holder in reads:
            if cache.job_scoped and holder == worker:
                cache.drop(part)  # read once and deleted there
        self.progress.advance(outcome.rows_in, outcome.bytes_in)
        return _DONE

    def _retry(self, stage: Stage, key: Key, reason: str) -> None:
        stage.attempts[key] += 1
        # a function that kills its worker (os._exit, a crash in C) kills each in turn; the
        # worker may have been running several partitions then, and any of them may be the one
        if self._last_loss[:2] != (stage.name, reason):
            self._last_loss = (stage.name, reason, [])
        self._last_loss[2].append(key[1])
        log.warning("%s: stage '%s' partition %d runs again: %s", self.id, stage.name, key[1],
                    reason)
        if stage.attempts[key] >= MAX_ATTEMPTS:
            raise JobFailed(f"{self.action}: partition {key[1]} of stage '{stage.name}' failed "
                            f"{stage.attempts[key]} times; last: {reason}")

    def _last_loss_said(self) -> str:
        """`` (the last ran partitions 2, 3 of stage 'collect': <reason>)``, or ""."""
        name, reason, parts = self._last_loss
        if not parts:
            return ""
        which = ", ".join(str(p) for p in sorted(parts))
        return (f" (the last ran partition{'s' if len(parts) > 1 else ''} {which} of stage "
                f"'{name}': {reason})")

    def _user_error(self, stage: Stage, key: Key, exc: RemoteError) -> RemoteError:
        side = f" of input {key[0] + 1}" if len(stage.inputs) > 1 else ""
        where = f"stage '{stage.name}' [{P.lineage(stage.inputs[key[0]])}], " \
                f"partition {key[1]}{side}"
        err = RemoteError(exc.remote_type, f"{exc.remote_message} (in {where})",
                          exc.remote_traceback, exc.node_id)
        err.stage, err.partition = stage.name, key[1]  # type: ignore[attr-defined]
        return err

    def _absorb_losses(self) -> None:
        """Forget every output held by a worker that died (or that a fetch named)."""
        gone = (self.engine.lost() | self.suspects) - self._absorbed
        if not gone:
            return
        self._absorbed |= gone
        log.info("%s: outputs on %s are lost and will be recomputed", self.id, sorted(gone))
        for stage in [*self._map_stages.values(), *self._result_stages]:
            for key in [k for k, (w, _) in stage.outputs.items() if w in gone]:
                del stage.outputs[key]
        for cache in [*self._user_caches, *self._caches.values()]:
            cache.forget(gone)

"""The worker side: a long-running task per worker that loops pull-compute-push.

Each step is one PUSH request to every server shard (this shard's updates, the step count,
the batch used and the compute time) and one reply from each, which the shard defers while
the barrier holds the worker and which carries the fresh values of the keys scheduled next.
Values arrive as read-only arrays on the received frames (no copy); updates leave the same
way, the small ones of a dtype packed into one buffer (``packing``). With ``overlap``
(``WorkerTask.overlap``) the next step computes while a push travels, on the values the
reply before carried.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from collections import abc
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from actorpy.errors import ActorpyTimeout, NodeLost, RemoteError, ServiceOverloaded
from actorpy.ids import NodeId
from engines.param.errors import JobFailed, UpdateError
from engines.param.kinds import ParamKind, Status
from engines.param.packing import pack, unpack

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataContext:
    """What a job's ``data=`` callable gets, once, on the worker that will use the data.

    Attributes:
        slot: this worker's data slot (0 .. slots-1 for the workers the job started with;
            a worker replacing a lost one gets the lost one's slot; later joiners get
            slots >= slots).
        slots: how many workers the job started with.
        seed: the job's seed.
        rng: a generator seeded from (seed, slot).
        worker: this worker's node id.
    """

    slot: int
    slots: int
    seed: int
    rng: np.random.Generator
    worker: NodeId


@dataclass
class WorkerContext:
    """What ``push`` gets on each step (an explicit context: no globals).

    Attributes:
        worker: this worker's node id.
        slot: its data slot (see :class:`DataContext`).
        data: what ``data=`` returned on this worker (None without one).
        rng: a numpy generator seeded from (job seed, slot): the same draws on every run
            (a worker that starts at step N > 0, resumed or joined: from (seed, slot, N)).
        batch_size: the batch this step should use (LB-BSP resizes it; it weights this
            worker's update in the aggregate).
        step: steps this worker has completed.
    """

    worker: NodeId
    slot: int
    data: Any
    rng: np.random.Generator
    batch_size: int
    step: int = 0


@dataclass(frozen=True)
class WorkerResult:
    """What a worker task returns to the driver."""

    worker: NodeId
    slot: int
    steps: int
    status: Status
    seconds: float
    stopped_at: int | None = None   # FINISH: the step where the job met its stop condition


@dataclass(frozen=True)
class WorkerTask:
    """The task the driver sends to each worker (``run(ctx)`` is called there)."""

    push: Callable[[WorkerContext, dict[str, Any]], dict[str, Any]]
    data: Callable[[DataContext], Any] | None
    shards: tuple[Any, ...]          # ServiceRef per shard
    key_map: dict[str, int]
    conductor: Any                    # ServiceRef of the job's conductor (SHARDS requests)
    generation: int
    slot: int
    slots: int
    seed: int
    batch: int
    timeout_s: float
    #: compute the next step while a push travels (``Job.run(overlap=...)``)
    overlap: bool = False

    def run(self, ctx: Any) -> WorkerResult:
        return _Loop(self, ctx).run()


def _overloaded(exc: BaseException) -> bool:
    """A refusal by a full inbox (as such, or as the remote error a reply carried)."""
    return isinstance(exc, ServiceOverloaded) or isinstance(exc.__cause__, ServiceOverloaded)


#: how long past the job's timeout_s a worker waits for its shards before giving up itself
DEADLINE_MARGIN_S = 5.0


class _Loop:
    """One worker's run (state kept out of the picklable task)."""

    def __init__(self, task: WorkerTask, ctx: Any) -> None:
        self.task, self.ctx = task, ctx
        self.refs = list(task.shards)
        self.generation = task.generation
        # past the job's timeout by a margin: the driver's own timeout, which says where
        # every worker is, must come first (at the same instant, this worker's bare
        # "waited past the job's timeout_s" won the race now and then); this one is for a
        # driver that went silent
        self.deadline = time.monotonic() + task.timeout_s + DEADLINE_MARGIN_S
        self.t0 = time.perf_counter()
        # the requests in flight: (kind, payload, the shard ref it went to)
        self._sent: dict[cf.Future, tuple[int, Any, Any]] = {}

    def run(self) -> WorkerResult:
        t = self.task
        me = NodeId(self.ctx.node_id)
        rng = np.random.default_rng([t.seed, t.slot])
        data = None
        if t.data is not None:
            data_rng = np.random.default_rng([t.seed, t.slot, 1])
            data = t.data(DataContext(t.slot, t.slots, t.seed, data_rng, me))
        wctx = WorkerContext(me, t.slot, data, rng, t.batch)
        replies = self._exchange([(ParamKind.JOIN, (0, t.slot))] * len(self.refs))
        ahead: list[tuple[int, Any]] | None = None   # the next step, computed meanwhile
        fresh = True
        while True:
            values = self._values(replies, wctx)
            if isinstance(values, WorkerResult):   # a step computed ahead is dropped
                return values
            if fresh and wctx.step > 0:
                # it starts at step N (resumed, or joined mid-run): draws of its own from
                # there; a resumed run drew its first steps' batches again
                wctx.rng = np.random.default_rng([t.seed, t.slot, wctx.step])
            fresh = False
            requests = ahead if ahead is not None else self._step(wctx, values)
            if not t.overlap:
                replies = self._exchange(requests, step=wctx.step)
                continue
            # the next step computes while this push travels, on the values the last reply
            # carried (so missing this push's update); the server released us only once
            # that step may begin (ShardConfig.lookahead)
            futures = self._start(requests)
            if all(f.done() for f in futures):   # answered at once (its shard is here and
                ahead = None                      # was idle): the next step reads the reply
                replies = self._collect(futures, step=wctx.step)
                continue
            ahead = self._step(wctx, values)
            replies = self._collect(futures, step=wctx.step - 1)

    def _values(self, replies: list[tuple], wctx: WorkerContext) -> Any:
        """The values the shards' replies carry (and the batch LB-BSP set), or the
        ``WorkerResult`` a reply that is not GO ends this worker with."""
        t = self.task
        for status, step, _, _, stopped_at in replies:
            if status != Status.GO:   # the server's count: a push after the stop is not one
                return WorkerResult(wctx.worker, t.slot, step, Status(status),
                                    time.perf_counter() - self.t0, stopped_at)
        if len(replies) == 1:
            values = unpack(replies[0][2])[0]
            wctx.step = max(wctx.step, replies[0][1])
        else:
            values = {}
            for _, step, part, _, _ in replies:
                values.update(unpack(part)[0])
                wctx.step = max(wctx.step, step)
        batch = replies[0][3]
        if batch is not None:   # LB-BSP: the coordinator's new batch for this worker
            wctx.batch_size = batch
        return values

    def _step(self, wctx: WorkerContext, values: dict[str, Any]) -> list[tuple[int, Any]]:
        """Compute a step's updates from ``values``: its PUSH request to each shard."""
        started = time.perf_counter()
        updates = self.task.push(wctx, values)
        if type(updates) is not dict and not isinstance(updates, abc.Mapping):
            if updates is None:   # a missing `return`: a step with no update would hide it
                raise TypeError(f"push on worker {wctx.worker} returned None; return a dict "
                                "of key -> update, or {} for no update this step")
            # with servers=N it failed here as "'list' object has no attribute 'items'",
            # and a generator could not be sent: the shard's check never saw either
            raise UpdateError(f"push on worker {wctx.worker} returned "
                              f"{type(updates).__name__}; it must return a dict of key -> "
                              "update")
        compute_s = time.perf_counter() - started
        wctx.step += 1
        if len(self.refs) == 1:   # every key (an unknown one too, which the shard refuses)
            return [(ParamKind.PUSH, (wctx.step, pack(updates), wctx.batch_size, compute_s))]
        parts: list[dict[str, Any]] = [{} for _ in self.refs]
        for key, value in updates.items():   # an unknown key goes to shard 0
            parts[self.task.key_map.get(key, 0)][key] = value
        return [(ParamKind.PUSH, (wctx.step, pack(part), wctx.batch_size, compute_s))
                for part in parts]

    def _exchange(self, requests: list[tuple[int, Any]], step: int = 0) -> list[tuple]:
        """Send one request per shard and wait for every reply (``_collect``)."""
        return self._collect(self._start(requests), step)

    def _start(self, requests: list[tuple[int, Any]]) -> dict[cf.Future, int]:
        """Send one request per shard; the futures of their replies, by shard."""
        return {self._send(i, kind, payload): i for i, (kind, payload) in enumerate(requests)}

    def _collect(self, futures: dict[cf.Future, int], step: int) -> list[tuple]:
        """Wait for every reply (raw reply tuples, by shard), or for the first reply that
        ends this worker (alone in the list). A lost shard is looked up again at the
        conductor and rejoined at ``step``, and so is every shard the directory the
        conductor sent names anew (its host died too: a reply it gave before is dropped).

        The requests are direct (``Node.request(..., direct=True)``): a remote shard's reply
        comes to this thread's own socket and this thread reads it while it waits, with no
        other thread in between (a lost shard still fails the future from the I/O thread,
        which wakes this one)."""
        replies: list[Any] = [None] * len(futures)
        sources: list[Any] = [None] * len(futures)   # the shard ref each reply came from
        later: list[tuple[float, int, tuple[int, Any]]] = []   # refused as overloaded
        refusals = 0
        while futures or later:
            now = time.monotonic()
            for item in [item for item in later if item[0] <= now]:
                later.remove(item)
                futures[self._send(item[1], *item[2])] = item[1]
            left = self.deadline - now
            if left <= 0:
                raise ActorpyTimeout(f"worker {self.ctx.node_id} waited past the job's "
                                     f"timeout_s={self.task.timeout_s} for its server shards")
            done = self.ctx.node.wait(futures, min([left] + [t - now for t, _, _ in later]))
            for fut in done:
                i = futures.pop(fut)
                sent = self._sent.pop(fut, None)
                try:
                    raw = fut.result(0)
                except NodeLost as exc:
                    # the driver gone, or this node closing (its shard went with it)
                    if exc.node_id in (self.task.conductor.node, self.ctx.node_id):
                        raise
                    if sent is None or sent[2] == self.refs[i]:   # else: replaced already
                        self._lookup(i)
                    futures[self._join(i, step)] = i
                    continue
                except (ServiceOverloaded, RemoteError) as exc:
                    if sent is not None and _overloaded(exc):
                        # the shard's inbox was full (large updates from many workers at
                        # once): the request was not taken, so it goes again after a pause
                        # that doubles, 1 ms to 0.1 s (before, the job failed)
                        refusals += 1
                        pause = min(0.1, 0.001 * 2 ** min(refusals - 1, 7))
                        later.append((time.monotonic() + pause, i, sent[:2]))
                        continue
                    if isinstance(exc.__cause__, UpdateError):   # our update was refused
                        raise UpdateError(str(exc.__cause__)) from None
                    raise
                if raw[0] != Status.GO:
                    for other in futures:
                        self._sent.pop(other, None)
                        self.ctx.node.forget(other)
                    return [raw]
                replies[i], sources[i] = raw, sent[2] if sent is not None else self.refs[i]
            for i, ref in enumerate(sources):
                if ref is not None and ref != self.refs[i]:
                    # both shards' hosts died at once: this one answered before its host
                    # died, and the directory the other's lookup brought names its
                    # replacement. It joins that now: before, its next push went there
                    # unjoined, was answered RELEASED ("a persistent straggler"), or it
                    # asked for a directory newer than the one it had, and the job timed out
                    replies[i] = sources[i] = None
                    futures[self._join(i, step)] = i
        return replies

    def _send(self, shard: int, kind: int, payload: Any) -> cf.Future:
        ref = self.refs[shard]
        fut = self.ctx.call_async(ref, kind, payload, direct=True)
        self._sent[fut] = (kind, payload, ref)
        return fut

    def _join(self, shard: int, step: int) -> cf.Future:
        """Join (the replacement of) a lost shard at ``step``."""
        return self._send(shard, ParamKind.JOIN, (step, self.task.slot))

    def _lookup(self, shard: int) -> None:
        """Shard ``shard`` was lost: ask the conductor for a newer shard directory."""
        log.info("worker %s: server shard %d lost; asking the conductor for its replacement",
                 self.ctx.node_id, shard)
        left = max(0.0, self.deadline - time.monotonic())
        try:
            generation, refs = self.ctx.call(self.task.conductor, ParamKind.SHARDS,
                                             self.generation, timeout_s=left)
        except ActorpyTimeout:
            raise JobFailed(f"server shard {shard} was lost and the driver named no "
                            f"replacement within the job's timeout") from None
        if generation is None:
            raise JobFailed(f"server shard {shard} was lost and could not be restarted "
                            "(see the driver's error)")
        self.generation, self.refs = generation, list(refs)

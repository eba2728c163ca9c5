"""The worker side: a long-running task per worker that loops pull-compute-push.

Each step is one PUSH request to every server shard (this shard's updates, the step count,
the batch used and the compute time) and one reply from each, which the shard defers while
the barrier holds the worker and which carries the fresh values of the keys scheduled next.
Values arrive as read-only arrays on the received frames (no copy); updates leave the same
way.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from actorpy.errors import ActorpyTimeout, NodeLost, RemoteError
from actorpy.ids import NodeId
from engines.param.errors import JobFailed, UpdateError
from engines.param.kinds import ParamKind, Push, Reply, Status

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
        rng: a numpy generator seeded from (job seed, slot): the same draws on every run.
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


@dataclass(frozen=True)
class WorkerTask:
    """The task the driver sends to each worker (``run(ctx)`` is called there)."""

    push: Callable[[WorkerContext, dict[str, Any]], dict[str, Any] | None]
    data: Callable[[DataContext], Any] | None
    shards: tuple[Any, ...]          # ServiceRef per shard
    key_map: dict[str, int]
    driver: NodeId
    control: int                      # the driver's service id for SHARDS requests
    generation: int
    slot: int
    slots: int
    seed: int
    batch: int
    timeout_s: float

    def run(self, ctx: Any) -> WorkerResult:
        return _Loop(self, ctx).run()


class _Loop:
    """One worker's run (state kept out of the picklable task)."""

    def __init__(self, task: WorkerTask, ctx: Any) -> None:
        self.task, self.ctx = task, ctx
        self.refs = list(task.shards)
        self.generation = task.generation
        self.deadline = time.monotonic() + task.timeout_s
        self._lock = threading.Lock()
        self._outstanding: set[cf.Future] = set()
        self._driver_lost = False
        # The current core returns nothing here; a richer one returns a subscription that
        # run() cancels when the task ends.
        self._subscription = ctx.node.on_node_lost(self._node_lost)

    def _node_lost(self, node: NodeId) -> None:
        """I/O thread: if the driver is gone, fail what we wait for (notify only)."""
        if node != self.task.driver:
            return
        with self._lock:
            self._driver_lost = True
            waiting = list(self._outstanding)
        for fut in waiting:
            try:
                fut.set_exception(NodeLost(node, "the job's driver is gone"))
            except cf.InvalidStateError:
                pass

    def run(self) -> WorkerResult:
        try:
            return self._run()
        finally:
            if hasattr(self._subscription, "cancel"):
                self._subscription.cancel()

    def _run(self) -> WorkerResult:
        t = self.task
        me = NodeId(self.ctx.node_id)
        t0 = time.perf_counter()
        rng = np.random.default_rng([t.seed, t.slot])
        data = None
        if t.data is not None:
            data_rng = np.random.default_rng([t.seed, t.slot, 1])
            data = t.data(DataContext(t.slot, t.slots, t.seed, data_rng, me))
        wctx = WorkerContext(me, t.slot, data, rng, t.batch)
        replies = self._exchange({i: (ParamKind.JOIN, (0, t.slot))
                                  for i in range(len(self.refs))})
        while True:
            end = next((r for r in replies.values() if r.status != Status.GO), None)
            if end is not None:   # the server's count: a step refused after the stop is not one
                return WorkerResult(me, t.slot, end.step, end.status, time.perf_counter() - t0)
            values: dict[str, Any] = {}
            for reply in replies.values():
                values.update(reply.values or {})
                wctx.step = max(wctx.step, reply.step)
            coordinator = replies.get(0)
            if coordinator is not None and coordinator.batch is not None:
                wctx.batch_size = coordinator.batch
            started = time.perf_counter()
            updates = t.push(wctx, values) or {}
            compute_s = time.perf_counter() - started
            wctx.step += 1
            parts: dict[int, dict[str, Any]] = {i: {} for i in range(len(self.refs))}
            for key, value in updates.items():   # an unknown key goes to shard 0, which says so
                parts[t.key_map.get(key, 0)][key] = value
            replies = self._exchange({i: (ParamKind.PUSH, Push(wctx.step, part, wctx.batch_size,
                                                                compute_s).wire())
                                      for i, part in parts.items()}, step=wctx.step)

    def _exchange(self, requests: dict[int, tuple[int, Any]], step: int = 0) -> dict[int, Reply]:
        """Send one request per shard and wait for every reply, or for the first reply that
        ends this worker. A lost shard is looked up again at the driver and rejoined."""
        futures = {self._send(i, kind, payload): i for i, (kind, payload) in requests.items()}
        replies: dict[int, Reply] = {}
        while futures:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise ActorpyTimeout(f"worker {self.ctx.node_id} waited past the job's "
                                     f"timeout_s={self.task.timeout_s} for its server shards")
            if len(futures) == 1:   # the common case (one shard): no waiter set-up
                only = next(iter(futures))
                try:
                    only.exception(left)
                except cf.TimeoutError:
                    continue
                done = {only}
            else:
                done, _ = cf.wait(futures, left, cf.FIRST_COMPLETED)
            for fut in done:
                i = futures.pop(fut)
                with self._lock:
                    self._outstanding.discard(fut)
                try:
                    reply = Reply.from_wire(fut.result(0))
                except NodeLost as exc:
                    if self._driver_lost or exc.node_id == self.task.driver:
                        raise
                    futures[self._rejoin(i, step)] = i
                    continue
                except RemoteError as exc:   # our update was refused: report it as ours
                    if isinstance(exc.__cause__, UpdateError):
                        raise UpdateError(str(exc.__cause__)) from None
                    raise
                replies[i] = reply
                if reply.status != Status.GO:
                    for other in futures:
                        self.ctx.node.forget(other)
                    return {i: reply}
        return replies

    def _send(self, shard: int, kind: int, payload: Any) -> cf.Future:
        fut = self.ctx.call_async(self.refs[shard], kind, payload)
        with self._lock:
            if self._driver_lost:
                raise NodeLost(self.task.driver, "the job's driver is gone")
            self._outstanding.add(fut)
        return fut

    def _rejoin(self, shard: int, step: int) -> cf.Future:
        """Shard ``shard`` was lost: ask the driver for its replacement, then join it."""
        log.info("worker %s: server shard %d lost; asking the driver for its replacement",
                 self.ctx.node_id, shard)
        left = max(0.0, self.deadline - time.monotonic())
        fut = self.ctx.node.request(self.task.driver, self.task.control, ParamKind.SHARDS,
                                    self.generation, what="the job's server shards")
        with self._lock:
            self._outstanding.add(fut)
        try:
            generation, refs = fut.result(left)
        except ActorpyTimeout:
            raise JobFailed(f"server shard {shard} was lost and the driver named no "
                            f"replacement within the job's timeout") from None
        finally:
            with self._lock:
                self._outstanding.discard(fut)
        if generation is None:
            raise JobFailed(f"server shard {shard} was lost and could not be restarted "
                            "(see the driver's error)")
        self.generation, self.refs = generation, list(refs)
        return self._send(shard, ParamKind.JOIN, (step, self.task.slot))

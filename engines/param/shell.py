"""The one place where a server shard meets the runtime: :class:`ShardService`, a core
service (one handler per kind) around the sans-I/O :class:`~engines.param.server.ServerCore`.

A PUSH or JOIN the core answers at once is answered by the handler's return value; one it
holds at the barrier is deferred (``env.defer()``) and answered from this service's thread
when a later event (a push, a departure) lets the worker go. The shard follows membership
itself (``ctx.subscribe``): a worker whose node died or left is dropped from the barrier the
moment this node hears of it. Everything runs on the service's own thread: no locks.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from actorpy.clock import SystemClock
from actorpy.errors import ConfigError
from actorpy.ids import NodeId
from actorpy.runtime.node import NodeEvent, NodeEventKind
from actorpy.runtime.service import Envelope, Reply, Service, ServiceContext, handles
from actorpy.values import QUICK_MODEL_BYTES, nbytes
from actorpy.wire.serde import IN_BAND_MAX_BYTES
from engines.param import checkpoint, packing
from engines.param.errors import UpdateError
from engines.param.kinds import Join, ParamKind, Push, Status
from engines.param.server import Answer, Callbacks, CheckpointDue, ServerCore, ShardConfig
from engines.param.store import Store

log = logging.getLogger(__name__)

#: How long a request for the final model waits for a stop that is due at a step (the
#: pushes completing that round are already on their way) before the shard stops anyway.
HALT_WAIT_S = 10.0


@dataclass(frozen=True)
class ShardSpec:
    """Everything a shard needs besides its initial values."""

    config: ShardConfig
    callbacks: Callbacks
    key_map: dict[str, int]
    checkpoint_dir: str | None = None
    resume: bool = False

    def checkpoint_path(self) -> str | None:
        if self.checkpoint_dir is None:
            return None
        c = self.config
        return checkpoint.path_for(self.checkpoint_dir, c.job, c.shard, c.shards)


class ShardService(Service):
    """A server shard hosted on a worker (``start_service(ShardService, spec, values)``).

    Args:
        ctx: the service's context.
        spec: the shard's settings and callbacks.
        values: the initial values of this shard's keys; with ``spec.resume`` the
            checkpoint's values replace them (after checking they match).

    Raises:
        ConfigError: ``checkpoint_dir`` is not a directory here.
        CheckpointError: resume was asked and the checkpoint is missing, corrupt or foreign.
    """

    def __init__(self, ctx: ServiceContext, spec: ShardSpec, values: dict[str, Any]) -> None:
        super().__init__(ctx)
        self.spec = spec
        self._path = spec.checkpoint_path()
        self._saves = checkpoint.SaveLog()
        if spec.checkpoint_dir is not None and not os.path.isdir(spec.checkpoint_dir):
            raise ConfigError(f"checkpoint_dir {spec.checkpoint_dir!r} is not a directory on "
                              f"the server's node {ctx.node_id}; create it (every shard host "
                              "must see it)")
        c = spec.config
        if self._path is None and nbytes(values) <= QUICK_MODEL_BYTES:
            self.quick_kinds = frozenset({ParamKind.JOIN, ParamKind.PUSH})
        store = Store(values, spec.key_map, c.shard)
        self.core = ServerCore(c, store, spec.callbacks, SystemClock())
        if spec.resume:
            assert self._path is not None
            self.core.restore(checkpoint.load(self._path, job=c.job, shard=c.shard,
                                              shards=c.shards, like=values))
            log.info("shard %d of %s resumed from %s at step %d", c.shard, c.job, self._path,
                     self.core.progress.base_step)
        if self._path is not None:   # the file on disk always belongs to this run
            # A shard that cannot write it refuses to start, resumed or not: a run that asked
            # for checkpoints must not learn that it has none when a shard is lost. (Resumed,
            # it writes back the model and clocks it just read.)
            try:
                if not spec.resume and os.path.isfile(self._path):
                    # an earlier run's (a crashed one, rerun without resume): kept, one
                    # generation, not overwritten (Run warns the driver)
                    os.replace(self._path, self._path + checkpoint.EARLIER)
                snapshot = self.core.snapshot()
                self._write(snapshot)
                self._saves.written(snapshot.base_step)
            except OSError as exc:
                raise ConfigError(f"checkpoint_dir {spec.checkpoint_dir!r}: shard {c.shard} "
                                  f"cannot write {self._path} on the server's node "
                                  f"{ctx.node_id}: {exc}") from None
        self._started_at: float | None = None
        self._halted_at: float | None = None
        self._first_push_wall: float | None = None
        self._waiting: dict[NodeId, Reply] = {}
        self._model_waiting: list[Reply] = []
        self._force: Any = None
        self._failure: BaseException | None = None
        self._stalled: str | None = None
        ctx.subscribe(self._membership)
        for w in sorted(c.expected):   # an expected worker that died before we subscribed
            if ctx.node.is_dead(w):
                self._guarded(lambda w=w: self.core.leave(w))

    # ----------------------------------------------------------------- per kind
    @handles(ParamKind.JOIN)
    def join(self, payload: tuple[int, int], env: Envelope) -> Any:
        step, slot = payload
        worker = NodeId(env.sender)
        return self._answer(worker, env, lambda: self.core.join(Join(worker, step, slot)))

    @handles(ParamKind.PUSH)
    def push(self, payload: tuple[int, dict[str, Any], int, float], env: Envelope) -> Any:
        worker = NodeId(env.sender)
        if self._first_push_wall is None:
            self._first_push_wall = time.time()
        push = Push.of(payload)
        return self._answer(worker, env, lambda: self.core.push(worker, push))

    @handles(ParamKind.HALT)
    def halt(self, at_step: int | None, env: Envelope) -> bool:
        """Stop, now (``None``) or once every worker completed ``at_step`` steps (the step
        where another shard met the stop condition); a request gets True."""
        if self._failure is None:
            self._guarded(lambda: self.core.halt(at_step=at_step))
        return True

    @handles(ParamKind.ABORT)
    def abort(self, _: Any, env: Envelope) -> bool:
        """The job failed: stop now, answering the workers HALTED (before: FINISH, so a
        failed run's stats said its workers reached the stop condition)."""
        if self._failure is None:
            self._guarded(lambda: self.core.halt(Status.HALTED))
        return True

    @handles(ParamKind.MODEL)
    def model(self, halt_first: bool, env: Envelope) -> Any:
        """The shard's values; with a true payload stop first (and save a final
        checkpoint). A stop due at a step is waited for, at most ``HALT_WAIT_S``."""
        if halt_first and self._failure is None and self.core.halted is None:
            if self.core.halting:
                self._model_waiting.append(env.defer())
                if self._force is None:
                    self._force = self.ctx.schedule(HALT_WAIT_S, self._halt_now)
                return None
            self._halt_now()
        return self.core.model()

    def _halt_now(self) -> None:
        if self._failure is None and self.core.halted is None:
            self._guarded(self.core.halt)

    @handles(ParamKind.STATS)
    def stats(self, _: Any, env: Envelope) -> dict[str, Any]:
        stats = self.core.stats()
        end = self._halted_at if self._halted_at is not None else time.monotonic()
        stats["train_seconds"] = end - self._started_at if self._started_at is not None else 0.0
        stats["first_push_wall"] = self._first_push_wall
        stats.update(self._saves.stats())
        t0 = self._started_at if self._started_at is not None else 0.0
        stats["trace"] = [{**row, "t": row["t"] - t0} for row in stats["trace"]]
        return stats

    def _membership(self, event: NodeEvent) -> None:
        """A node died or left: if it was one of our workers, it leaves the barrier."""
        if event.kind is NodeEventKind.JOINED:
            return
        worker = NodeId(event.node_id)
        self._waiting.pop(worker, None)   # nobody waits for that answer any more
        if self._failure is None:
            self._guarded(lambda: self.core.leave(worker))

    # ----------------------------------------------------------------- plumbing
    def _answer(self, worker: NodeId, env: Envelope, event: Callable[[], list]) -> Any:
        """Run a worker's event; its own answer is the return value when the core gives it
        at once, else the request is deferred until a later event answers it."""
        if self._failure is not None:
            raise self._failure
        try:
            actions = event()
        except UpdateError:   # this worker's bad update: only it hears of it
            raise
        except Exception as exc:
            self._fail(exc)
            raise
        mine, local = self._apply(actions, worker)
        try:
            if mine is not None and not packing.read_only(mine[2]):
                return mine   # the runtime's reply copies the arrays first
            if mine is not None and not local and packing.largest(mine[2]) <= IN_BAND_MAX_BYTES:
                # The runtime's copy is of arrays that travel out of band: small ones copy
                # nothing, and a returned reply skips the deferred one's bookkeeping (with
                # answers for this node to send, the deferred one goes first, see _apply).
                return mine
            reply = env.defer()
            if mine is not None:
                # Read-only store values are replaced by pull, never changed in place: a
                # deferred reply sends them as they are (``Reply.send`` copies nothing; a
                # worker on this node reads them in place), without the copy a returned
                # value gets (4 MB per step, 1M-float model).
                reply.send(mine)
            else:
                self._waiting[worker] = reply
            return None
        finally:
            self._send_all(local)

    def _guarded(self, event: Callable[[], list]) -> None:
        try:
            actions = event()
        except Exception as exc:
            self._fail(exc)
            return
        _, local = self._apply(actions)
        self._send_all(local)

    def _apply(self, actions: list, current: NodeId | None = None
               ) -> tuple[Any, list[tuple[Reply, Any]]]:
        """Send what the core decided; returns ``current``'s own answer, if among them, and
        the answers to workers on this node, which the caller sends last.

        A worker on this node is woken by its answer at once, on this process's interpreter:
        answered first, it would run its next step while this thread still encodes and
        sends the other workers' answers (and wait for the interpreter lock to do so), so
        those go first and a remote worker is not kept waiting behind a local one."""
        if self._started_at is None and self.core.started:
            self._started_at = time.monotonic()
        mine = None
        local: list[tuple[Reply, Any]] = []
        here = self.ctx.node_id
        packed: dict[int, Any] = {}   # answers released together share one values dict
        for action in actions:
            if isinstance(action, Answer):
                if action.worker == current:
                    mine = action.reply.wire(packed)
                    continue
                reply = self._waiting.pop(action.worker, None)
                if reply is None:
                    continue
                if reply.sender == here:
                    local.append((reply, action.reply.wire(packed)))
                else:
                    reply.send(action.reply.wire(packed))
            elif isinstance(action, CheckpointDue) and self._path is not None:
                self._save(action.snapshot)
        if self._halted_at is None and self.core.halted is not None:
            self._halted_at = time.monotonic()
            if self._path is not None:   # the final checkpoint
                self._save(self.core.snapshot())
        if self.core.stalled != self._stalled:   # (a fixed workers= list fails instead)
            self._stalled = self.core.stalled
            if self._stalled is not None:
                log.warning("job %s: %s; waiting for a worker to join until the job's "
                            "timeout_s", self.spec.config.job, self._stalled)
        if self._model_waiting and self.core.halted is not None:
            waiting, self._model_waiting = self._model_waiting, []
            for reply in waiting:
                reply.send(self.core.model())
        return mine, local

    @staticmethod
    def _send_all(replies: list[tuple[Reply, Any]]) -> None:
        for reply, value in replies:
            reply.send(value)

    def _fail(self, exc: BaseException) -> None:
        """A server-side callback raised: every worker waiting here, and every later
        request, gets the error (so all their tasks end with it)."""
        log.error("shard %d of %s failed: %s", self.spec.config.shard, self.spec.config.job, exc)
        self._failure = exc
        waiting, self._waiting = self._waiting, {}
        for reply in [*waiting.values(), *self._model_waiting]:
            if not reply.done:
                reply.fail(exc)
        self._model_waiting = []

    def _write(self, snapshot: checkpoint.Snapshot) -> None:
        c = self.spec.config
        assert self._path is not None
        checkpoint.save(self._path, snapshot, job=c.job, shard=c.shard, shards=c.shards)

    def _save(self, snapshot: checkpoint.Snapshot) -> None:
        """Write a checkpoint; one that fails is logged (once for a run of failures, see
        ``checkpoint.SaveLog``), counted in the stats, and training goes on."""
        c = self.spec.config
        try:
            self._write(snapshot)
        except (OSError, ConfigError) as exc:
            first = self._saves.failed(exc)
            log.log(logging.ERROR if first else logging.DEBUG,
                    "shard %d of %s could not write its checkpoint %s: %s%s", c.shard, c.job,
                    self._path, exc, "; training goes on, and later failures are counted "
                    "(the job's stats and its end say how many)" if first else "")
            return
        failed = self._saves.written(snapshot.base_step)
        if failed:
            log.info("shard %d of %s wrote its checkpoint again, at step %d, after %d failed",
                     c.shard, c.job, snapshot.base_step, failed)

"""The one place where a server shard meets the runtime: :class:`ShardService`, a core
service (``handle(msg, ctx)``, replies with ``ctx.reply``) around the sans-I/O
:class:`~engines.param.server.ServerCore`.

A PUSH or JOIN request is kept until the core answers it: a worker held at the barrier
simply has its request answered later, from this service's thread, when an event lets it
go. Membership news (a worker gone) arrives as a LEAVE message cast by the job's driver,
whose ``on_node_lost`` listener only posts; so everything here runs on the service's own
thread and needs no lock.

Porting to a richer service API means changing only this module: the dispatch in
``handle`` becomes per-kind handlers, LEAVE becomes the service's own membership event, and
checkpoint timers (if wanted) its own cancellable timers.
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
from engines.param import checkpoint
from engines.param.errors import UpdateError
from engines.param.kinds import Join, ParamKind, Push
from engines.param.server import Answer, Callbacks, CheckpointDue, ServerCore, ShardConfig
from engines.param.store import Store

log = logging.getLogger(__name__)


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


class ShardService:
    """A server shard hosted on a worker (``cluster.start_service(ShardService, spec, init)``).

    Args:
        ctx: the hosting worker's context (replies go through it).
        spec: the shard's settings and callbacks.
        values: the initial values of this shard's keys; with ``spec.resume`` the
            checkpoint's values replace them (after checking they match).

    Raises:
        ConfigError: ``checkpoint_dir`` is not a directory here.
        CheckpointError: resume was asked and the checkpoint is missing, corrupt or foreign.
    """

    def __init__(self, ctx: Any, spec: ShardSpec, values: dict[str, Any]) -> None:
        self.spec = spec
        self._path = spec.checkpoint_path()
        if spec.checkpoint_dir is not None and not os.path.isdir(spec.checkpoint_dir):
            raise ConfigError(f"checkpoint_dir {spec.checkpoint_dir!r} is not a directory on "
                              f"the server's node {ctx.node_id}; create it (every shard host "
                              "must see it)")
        c = spec.config
        store = Store(values, spec.key_map, c.shard)
        self.core = ServerCore(c, store, spec.callbacks, SystemClock())
        if spec.resume:
            assert self._path is not None
            self.core.restore(checkpoint.load(self._path, job=c.job, shard=c.shard,
                                              shards=c.shards, like=values))
            log.info("shard %d of %s resumed from %s at step %d", c.shard, c.job, self._path,
                     self.core.progress.base_step)
        elif self._path is not None:   # the file on disk always belongs to this run
            self._save(self.core.snapshot())
        self._started_at: float | None = None
        self._halted_at: float | None = None
        self._first_push_wall: float | None = None
        self._waiting: dict[NodeId, Any] = {}
        self._failure: BaseException | None = None
        self._handlers: dict[int, Callable[[Any, Any], None]] = {
            ParamKind.JOIN: self._join, ParamKind.PUSH: self._push,
            ParamKind.LEAVE: self._leave, ParamKind.HALT: self._halt,
            ParamKind.MODEL: self._model, ParamKind.STATS: self._stats}

    def handle(self, msg: Any, ctx: Any) -> None:
        handler = self._handlers.get(msg.kind)
        if handler is None:
            raise ValueError(f"parameter-server shard got unknown kind {msg.kind}")
        handler(msg, ctx)

    # ----------------------------------------------------------------- per kind
    def _join(self, msg: Any, ctx: Any) -> None:
        step, slot = msg.payload()
        worker = NodeId(msg.sender)
        self._run(worker, msg, ctx, lambda: self.core.join(Join(worker, step, slot)))

    def _push(self, msg: Any, ctx: Any) -> None:
        worker = NodeId(msg.sender)
        if self._first_push_wall is None:
            self._first_push_wall = time.time()
        push = Push(*msg.payload())
        self._run(worker, msg, ctx, lambda: self.core.push(worker, push))

    def _leave(self, msg: Any, ctx: Any) -> None:
        worker = NodeId(msg.payload())
        self._waiting.pop(worker, None)
        if self._failure is None:
            self._guarded(ctx, lambda: self.core.leave(worker))

    def _halt(self, msg: Any, ctx: Any) -> None:
        if self._failure is None:
            self._guarded(ctx, self.core.halt)
        if msg.header.request_id:
            ctx.reply(msg, True)

    def _model(self, msg: Any, ctx: Any) -> None:
        """Reply the shard's values; with a true payload halt first (and save a final
        checkpoint)."""
        if msg.payload() and self._failure is None and self.core.halted is None:
            self._guarded(ctx, self.core.halt)
            if self._path is not None and self._failure is None:
                self._save(self.core.snapshot())
        ctx.reply(msg, self.core.model())

    def _stats(self, msg: Any, ctx: Any) -> None:
        stats = self.core.stats()
        end = self._halted_at if self._halted_at is not None else time.monotonic()
        stats["train_seconds"] = end - self._started_at if self._started_at is not None else 0.0
        stats["first_push_wall"] = self._first_push_wall
        t0 = self._started_at if self._started_at is not None else 0.0
        stats["trace"] = [{**row, "t": row["t"] - t0} for row in stats["trace"]]
        ctx.reply(msg, stats)

    # ----------------------------------------------------------------- plumbing
    def _run(self, worker: NodeId, msg: Any, ctx: Any, event: Callable[[], list]) -> None:
        if self._failure is not None:
            ctx.reply_error(msg, self._failure)
            return
        self._waiting[worker] = msg
        try:
            actions = event()
        except UpdateError as exc:   # this worker's bad update: only it hears of it
            self._waiting.pop(worker, None)
            ctx.reply_error(msg, exc)
            return
        except Exception as exc:
            self._fail(ctx, exc)
            return
        self._apply(ctx, actions)

    def _guarded(self, ctx: Any, event: Callable[[], list]) -> None:
        try:
            actions = event()
        except Exception as exc:
            self._fail(ctx, exc)
            return
        self._apply(ctx, actions)

    def _apply(self, ctx: Any, actions: list) -> None:
        if self._started_at is None and self.core.started:
            self._started_at = time.monotonic()
        if self._halted_at is None and self.core.halted is not None:
            self._halted_at = time.monotonic()
        for action in actions:
            if isinstance(action, Answer):
                msg = self._waiting.pop(action.worker, None)
                if msg is not None:
                    ctx.reply(msg, action.reply.wire())
            elif isinstance(action, CheckpointDue) and self._path is not None:
                self._save(action.snapshot)

    def _fail(self, ctx: Any, exc: BaseException) -> None:
        """A server-side callback raised: every worker waiting here, and every later
        request, gets the error (so all their tasks end with it)."""
        log.error("shard %d of %s failed: %s", self.spec.config.shard, self.spec.config.job, exc)
        self._failure = exc
        waiting, self._waiting = self._waiting, {}
        for msg in waiting.values():
            ctx.reply_error(msg, exc)

    def _save(self, snapshot: checkpoint.Snapshot) -> None:
        c = self.spec.config
        assert self._path is not None
        try:
            checkpoint.save(self._path, snapshot, job=c.job, shard=c.shard, shards=c.shards)
        except (OSError, ConfigError) as exc:
            log.error("shard %d of %s could not write its checkpoint %s: %s", c.shard, c.job,
                      self._path, exc)

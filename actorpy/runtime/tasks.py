"""Running tasks on a worker: the task pool, per-task contexts, cancellation and the worker
end of streams (``ctx.emit``).

A task that was submitted as a stream (``Cluster.submit_stream``) sends each ``emit``ted
item to its submitter at once, but at most a window of items (and bytes) ahead of what the
submitter has consumed: the submitter grants more as it iterates (STREAM_CREDIT), so a
fast producer waits instead of growing the driver's memory. A cancelled task is removed
if it is still queued; a running one has ``ctx.cancelled`` set, its blocked or next
``emit`` raises TaskCancelled, and its result is dropped.
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable

from actorpy.errors import ActorpyError, ActorpyTimeout, TaskCancelled
from actorpy.ids import NodeId
from actorpy.runtime.context import WorkerContext
from actorpy.runtime.node import Node, NodeEvent, NodeEventKind
from actorpy.runtime.store import DEFAULT_SEGMENT_BYTES
from actorpy.wire import message as wm
from actorpy.wire.kinds import CORE_SERVICE, Kind

log = logging.getLogger(__name__)


class CancelState(enum.Enum):
    """Where a task was when its cancellation reached its worker."""

    QUEUED = "queued"      # removed before it ran
    RUNNING = "running"    # flagged: ctx.cancelled is set, its result is dropped
    FINISHED = "finished"  # done already (or never seen): nothing to cancel


@dataclass(frozen=True)
class ContextCallTask:
    """``fn(ctx, *args, **kwargs)`` as a task: for functions that use their context
    (``ctx.emit``, ``ctx.cancelled``)."""

    fn: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None

    def run(self, ctx: WorkerContext) -> Any:
        return self.fn(ctx, *self.args, **(self.kwargs or {}))


@dataclass(frozen=True)
class StreamTask:
    """A task run as a stream: opens the stream's window, then runs ``task``."""

    task: Any
    stream_id: int
    window_items: int
    window_bytes: int

    def run(self, ctx: TaskContext) -> Any:
        ctx._open_stream(self.stream_id, self.window_items, self.window_bytes)
        return self.task.run(ctx)


class _TaskState:
    """One task from TASK to its answer (guarded by ``cond``)."""

    def __init__(self, msg: wm.Message) -> None:
        self.msg = msg
        self.requester = NodeId(msg.sender)
        self.key = (msg.sender, msg.header.request_id)
        self.cond = threading.Condition(threading.Lock())
        self.future: Future | None = None
        self.running = False
        self.cancelled = False
        self.cancel_reason = ""
        self.stream_id: int | None = None
        self.window_items = self.window_bytes = 0
        self.sent_items = self.sent_bytes = self.acked_items = self.acked_bytes = 0

    def cancel(self, reason: str) -> None:
        with self.cond:
            if not self.cancelled:
                self.cancelled, self.cancel_reason = True, reason
            self.cond.notify_all()


class TaskContext(WorkerContext):
    """Handed to ``Task.run``: a WorkerContext plus this task's cancel flag and stream."""

    def __init__(self, node: Node, store: Any, services: Any, state: _TaskState,
                 runner: TaskRunner) -> None:
        super().__init__(node, store)
        self.services = services
        self._state = state
        self._runner = runner

    def put(self, key: str, value: Any) -> int:
        """As ``WorkerContext.put``; the block belongs to this task's submitter, and goes
        when it leaves or dies (``ObjectStore.drop_owner``)."""
        return self.store.put(key, value, owner=self._state.requester)

    def put_stream(self, key: str, items: Iterable[Any], *,
                   segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> int:
        """As ``WorkerContext.put_stream``; owned by this task's submitter, as ``put``."""
        return self.store.put_stream(key, items, segment_bytes=segment_bytes,
                                     owner=self._state.requester)

    @property
    def cancelled(self) -> bool:
        """Whether the submitter cancelled this task (or went away): stop early."""
        return self._state.cancelled

    def check_cancelled(self) -> None:
        """Raise TaskCancelled if the task was cancelled (call it between steps)."""
        if self._state.cancelled:
            raise TaskCancelled(self._state.cancel_reason)

    def wait_cancelled(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a cancellation; True if cancelled."""
        with self._state.cond:
            return self._state.cond.wait_for(lambda: self._state.cancelled, timeout_s)

    def emit(self, item: Any, *, timeout_s: float | None = None) -> None:
        """Send ``item`` to the submitter's stream (``submit_stream``), in order.

        Waits while the submitter holds a full window of unconsumed items.

        Raises:
            TaskCancelled: the task was cancelled (or its submitter is gone).
            ActorpyTimeout: ``timeout_s`` passed with the window still full.
            ActorpyError: the task was not submitted as a stream.
        """
        state = self._state
        if state.stream_id is None:
            raise ActorpyError("emit() needs a task submitted as a stream "
                               "(cluster.submit_stream / submit_stream_task)")
        enc = item if isinstance(item, wm.Encoded) else wm.Encoded.of(item, self.node.chunk_bytes)
        nbytes = enc.nbytes
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with state.cond:
            while True:
                if state.cancelled:
                    raise TaskCancelled(state.cancel_reason)
                items = state.sent_items - state.acked_items
                held = state.sent_bytes - state.acked_bytes
                if items == 0 or (items < state.window_items
                                  and held + nbytes <= state.window_bytes):
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise ActorpyTimeout(f"emit waited {timeout_s} s for {state.requester} to "
                                         f"consume the stream ({items} items unconsumed)")
                state.cond.wait(left)
            state.sent_items += 1
            state.sent_bytes += nbytes
        self.node.send(state.requester, CORE_SERVICE, Kind.STREAM_ITEM, enc,
                       request_id=state.stream_id)

    def _open_stream(self, stream_id: int, window_items: int, window_bytes: int) -> None:
        state = self._state
        state.stream_id = stream_id
        state.window_items, state.window_bytes = max(1, window_items), max(1, window_bytes)
        self._runner.open_stream(state)


class TaskRunner:
    """A worker's task pool: TASK, CANCEL and STREAM_CREDIT (handlers on the I/O thread).

    Args:
        node: the worker's node.
        store, services: what task contexts expose.
        threads: tasks run at once.
    """

    def __init__(self, node: Node, store: Any, services: Any, threads: int) -> None:
        self.node, self.store, self.services = node, store, services
        self._executor = ThreadPoolExecutor(threads,
                                            thread_name_prefix=f"actorpy-task-{node.node_id}")
        self._lock = threading.Lock()
        self._tasks: dict[tuple[str, int], _TaskState] = {}
        self._streams: dict[tuple[str, int], _TaskState] = {}
        self._closed = False
        node.on(CORE_SERVICE, Kind.TASK, self._submit)
        node.on(CORE_SERVICE, Kind.CANCEL, self._cancel)
        node.on(CORE_SERVICE, Kind.STREAM_CREDIT, self._credit)
        self._membership = node.subscribe(self._node_event)

    def _submit(self, msg: wm.Message) -> None:
        state = _TaskState(msg)
        with self._lock:
            # A task that arrives while the worker stops (its node still reads) is dropped,
            # as a queued one is at close: the submitter learns from the worker's going.
            if self._closed:
                log.debug("dropping task %s: this worker is stopping", state.key)
                return
            self._tasks[state.key] = state
            state.future = self._executor.submit(self._run, state)

    def _run(self, state: _TaskState) -> None:
        with self._lock:
            if state.cancelled:
                self._tasks.pop(state.key, None)
                return
            state.running = True
        ctx = TaskContext(self.node, self.store, self.services, state, self)
        try:
            task = state.msg.payload()
            result = task.run(ctx)
        except BaseException as exc:  # everything a task raises goes back to its caller
            self._answer(state, exc, failed=True)
            if not isinstance(exc, Exception):
                raise
        else:
            self._answer(state, result, failed=False)
        finally:
            with self._lock:
                self._tasks.pop(state.key, None)
                if state.stream_id is not None:
                    self._streams.pop((state.key[0], state.stream_id), None)

    def _answer(self, state: _TaskState, value: Any, failed: bool) -> None:
        if state.cancelled:
            log.debug("dropping the answer of cancelled task %s", state.key)
            return
        msg = state.msg
        try:
            if failed:
                self.node.reply_error(msg, value)
            else:
                self.node.reply(msg, value)
        except Exception as exc:  # e.g. the result does not pickle: say so to the caller
            if self.node.closed:
                # the worker stops (its driver or manager gone, a SIGTERM): nobody waits for
                # this answer. Before: "could not report a failure" with a traceback
                log.debug("no answer to %s: this worker is stopping (%s)", msg.sender, exc)
                return
            if not failed:
                self.node.reply_error(msg, exc)
            else:
                log.exception("could not report a failure to %s", msg.sender)

    def open_stream(self, state: _TaskState) -> None:
        assert state.stream_id is not None
        with self._lock:
            self._streams[(state.key[0], state.stream_id)] = state

    def _cancel(self, msg: wm.Message) -> None:
        rid = msg.payload()
        with self._lock:
            state = self._tasks.get((msg.sender, rid)) if isinstance(rid, int) else None
            outcome = self._cancel_locked(state, f"cancelled by {msg.sender}")
        log.debug("cancel of task %s from %s: %s", rid, msg.sender, outcome.value)
        if msg.header.request_id:
            self.node.reply(msg, outcome.value)

    def _cancel_locked(self, state: _TaskState | None, reason: str) -> CancelState:
        if state is None:
            return CancelState.FINISHED
        if not state.running:
            state.cancel(reason)
            if state.future is not None:
                state.future.cancel()
            self._tasks.pop(state.key, None)
            return CancelState.QUEUED
        state.cancel(reason)
        return CancelState.RUNNING

    def _credit(self, msg: wm.Message) -> None:
        with self._lock:
            state = self._streams.get((msg.sender, msg.header.request_id))
        if state is None:
            return  # the task is over: a late credit
        try:
            items, nbytes = msg.payload()
        except (TypeError, ValueError):
            log.warning("dropped a malformed stream credit from %s", msg.sender)
            return
        with state.cond:
            state.acked_items = max(state.acked_items, int(items))
            state.acked_bytes = max(state.acked_bytes, int(nbytes))
            state.cond.notify_all()

    def _node_event(self, event: NodeEvent) -> None:
        if event.kind is NodeEventKind.JOINED:
            return
        with self._lock:
            mine = [s for s in self._tasks.values() if s.requester == event.node_id]
            for state in mine:
                self._cancel_locked(state, f"its submitter {event.node_id} is gone")
        dropped = self.store.drop_owner(event.node_id) if self.store is not None else 0
        if dropped:
            log.info("dropped %d stored blocks of %s, which is gone", dropped, event.node_id)

    def close(self) -> None:
        """Drop queued tasks and flag running ones (they cannot be interrupted)."""
        self._membership.cancel()
        with self._lock:
            self._closed = True
            for state in list(self._tasks.values()):
                self._cancel_locked(state, f"worker {self.node.node_id} is stopping")
        self._executor.shutdown(wait=False, cancel_futures=True)

    def pending(self) -> int:
        """Tasks queued or running here."""
        with self._lock:
            return len(self._tasks)


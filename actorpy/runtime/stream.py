"""The driver end of streams: the items a task ``emit``s, iterated as they come, then the
task's final value or its error (see actorpy.runtime.tasks for the worker end).

Flow control: the stream holds at most ``window_items`` items and ``window_bytes`` bytes
(plus one item) that the driver has not consumed; the worker's ``emit`` waits for credit,
which the stream grants as the driver iterates. A worker that sends beyond its window
breaks the protocol and fails the stream with a ProtocolError (nothing more is buffered).
"""
from __future__ import annotations

import functools
import itertools
import logging
import math
import threading
import time
import weakref
from collections import deque
from concurrent.futures import CancelledError
from typing import Any, Callable, Iterator

from actorpy.errors import ActorpyError, ActorpyTimeout, ConfigError, ProtocolError
from actorpy.ids import NodeId
from actorpy.runtime.node import Node
from actorpy.runtime.reply import ReplyFuture, check_seconds
from actorpy.runtime.tasks import CancelState
from actorpy.wire import message as wm
from actorpy.wire.kinds import CORE_SERVICE, Kind

log = logging.getLogger(__name__)


class StreamTable:
    """The streams a node has open, keyed by stream id; routes STREAM_ITEM to them."""

    def __init__(self, node: Node) -> None:
        self.node = node
        # weak: a stream its consumer dropped is collected, and that cancels its task
        # (``TaskStream.attach``)
        self._streams: weakref.WeakValueDictionary[int, TaskStream] = \
            weakref.WeakValueDictionary()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        node.on(CORE_SERVICE, Kind.STREAM_ITEM, self._item)

    def new_id(self) -> int:
        return next(self._ids)

    def add(self, stream: TaskStream) -> None:
        with self._lock:
            self._streams[stream.stream_id] = stream

    def remove(self, stream_id: int) -> None:
        with self._lock:
            self._streams.pop(stream_id, None)

    def __len__(self) -> int:
        return len(self._streams)

    def _item(self, msg: wm.Message) -> None:
        stream = self._streams.get(msg.header.request_id)
        if stream is None or stream.dest != msg.sender:
            log.debug("dropped a stream item from %s for stream %d (over, or not its own)",
                      msg.sender, msg.header.request_id)
            return
        stream._push(msg)


def _stream_ended(ref: weakref.ref[TaskStream], fut: object) -> None:
    stream = ref()
    if stream is not None:
        stream._ended(fut)


def _abandoned(future: ReplyFuture, table: StreamTable, stream_id: int) -> None:
    """A stream was collected: its task, if still running, is cancelled (``attach``)."""
    table.remove(stream_id)
    if not future.done():
        future.cancel()   # (a submitted task's future casts a CANCEL to its worker)


class TaskStream:
    """Items a task emits, in order. Iterate it (each item waits at most ``timeout_s``),
    then ``result()`` is the task's return value. A task that raised ends the iteration
    with its RemoteError, after the items it emitted before; a lost worker with NodeLost.

    Example::

        def produce(ctx, n):
            for i in range(n):
                ctx.emit(i * i)
            return "done"

        with cluster.submit_stream(produce, 5) as stream:
            assert list(stream) == [0, 1, 4, 9, 16] and stream.result(10) == "done"
    """

    def __init__(self, node: Node, table: StreamTable, dest: NodeId, window_items: int,
                 window_bytes: int, timeout_s: float,
                 canceller: Callable[[ReplyFuture, float], CancelState]) -> None:
        self._node, self._table = node, table
        self.stream_id = table.new_id()
        self.future: ReplyFuture = ReplyFuture(dest, "a stream not yet sent")
        self.dest = dest
        self.window_items, self.window_bytes = window_items, window_bytes
        self.timeout_s = timeout_s
        self._canceller = canceller
        self._cond = threading.Condition(threading.Lock())
        self._buffer: deque[tuple[wm.Message, int]] = deque()
        self._buffered_bytes = 0
        self._consumed = self._consumed_bytes = 0
        self._credited = self._credited_bytes = 0
        self._broken: ActorpyError | None = None
        self._cancelled = False
        #: items received, and the most items / bytes held unconsumed at once
        self.received = 0
        self.peak_items = self.peak_bytes = 0
        table.add(self)  # before the task goes out: its first item may beat request()

    def attach(self, future: ReplyFuture) -> None:
        """The submitted task's future (its end, and its final value or error)."""
        with self._cond:
            self.future = future
        # Neither the future nor the table keeps the stream alive: one its consumer drops
        # (a `break` out of `for item in cluster.submit_stream(...)`, no `with`) cancels its
        # task. Before, the task waited in `emit` for credit that never came, holding its
        # worker's task slot: every later task there timed out.
        future.add_done_callback(functools.partial(_stream_ended, weakref.ref(self)))
        weakref.finalize(self, _abandoned, future, self._table, self.stream_id)

    # ------------------------------------------------------------------ I/O thread
    def _push(self, msg: wm.Message) -> None:
        nbytes = sum(len(f) for f in msg.frames)
        with self._cond:
            if self._broken is not None or self._cancelled:
                return
            held = len(self._buffer)
            if held >= self.window_items or (held and self._buffered_bytes + nbytes
                                             > self.window_bytes):
                self._broken = ProtocolError(
                    f"{self.dest} sent stream {self.stream_id} more than its window "
                    f"({self.window_items} items / {self.window_bytes} bytes); stream dropped")
                self._buffer.clear()
                self._table.remove(self.stream_id)
            else:
                self._buffer.append((msg, nbytes))
                self._buffered_bytes += nbytes
                self.received += 1
                self.peak_items = max(self.peak_items, len(self._buffer))
                self.peak_bytes = max(self.peak_bytes, self._buffered_bytes)
            self._cond.notify_all()

    def _ended(self, _fut: object) -> None:
        # Items travel before the task's answer on one connection, so none can follow.
        self._table.remove(self.stream_id)
        with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------------ consumer
    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return self.next(self.timeout_s)

    def next(self, timeout_s: float) -> Any:
        """The next item (waiting at most ``timeout_s``); StopIteration at the end.

        Raises:
            ActorpyTimeout: no item and no end within ``timeout_s``.
            RemoteError, NodeLost: the task failed, or its worker was lost.
        """
        check_seconds("timeout_s", timeout_s)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not (self._buffer or self.future.done() or self._broken or self._cancelled):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ActorpyTimeout(f"stream {self.stream_id} from {self.dest} gave no item "
                                         f"within {timeout_s} s; raise timeout_s, or check the "
                                         "worker's log")
                self._cond.wait(min(left, threading.TIMEOUT_MAX))  # a lock waits no longer
            if self._broken is not None:
                raise self._broken
            if not self._buffer:
                if self._cancelled:
                    raise StopIteration
                self._finish()  # raises the task's error, if it failed
                raise StopIteration
            msg, nbytes = self._buffer.popleft()
            self._buffered_bytes -= nbytes
            self._consumed += 1
            self._consumed_bytes += nbytes
            credit = self._credit_due()
        if credit is not None:
            self._send_credit(credit)
        return msg.payload()

    def _credit_due(self) -> tuple[int, int] | None:
        """Credit after half a window, or whenever the buffer runs dry (so a producer
        held back by a byte budget smaller than its item is never stuck)."""
        items = self._consumed - self._credited
        nbytes = self._consumed_bytes - self._credited_bytes
        if items and (not self._buffer or 2 * items >= self.window_items
                      or 2 * nbytes >= self.window_bytes):
            self._credited, self._credited_bytes = self._consumed, self._consumed_bytes
            return self._consumed, self._consumed_bytes
        return None

    def _send_credit(self, credit: tuple[int, int]) -> None:
        if self.future.done():
            return
        try:
            self._node.send(self.dest, CORE_SERVICE, Kind.STREAM_CREDIT, credit,
                            request_id=self.stream_id)
        except ActorpyError as exc:
            log.debug("could not credit stream %d: %s", self.stream_id, exc)

    def _finish(self) -> None:
        if self.future.cancelled():
            return
        self.future.result(0)  # raises RemoteError / NodeLost when the task failed

    def result(self, timeout: float | None = None, *, timeout_s: float | None = None) -> Any:
        """The task's return value, once it ends; items not yet iterated are discarded.

        Takes its time limit as a future's ``result`` does (``result(30)``,
        ``result(timeout=30)``; None: no limit), or as ``timeout_s=``.

        Raises:
            RemoteError, NodeLost: as for ``next``; CancelledError if it was cancelled.
            ActorpyTimeout: it did not end within the time limit.
            ConfigError: both ``timeout`` and ``timeout_s``, or a limit that is no number.
        """
        if timeout_s is not None:
            if timeout is not None:
                raise ConfigError("give result() timeout or timeout_s, not both")
            timeout = timeout_s
        timeout_s = math.inf if timeout is None else timeout
        check_seconds("timeout_s", timeout_s)
        deadline = time.monotonic() + timeout_s
        for _ in self._drain(deadline, timeout_s):
            pass
        if self._cancelled or self.future.cancelled():
            raise CancelledError(f"stream {self.stream_id} was cancelled")
        return self.future.result(0)

    def _drain(self, deadline: float, timeout_s: float) -> Iterator[Any]:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ActorpyTimeout(f"stream {self.stream_id} from {self.dest} did not end "
                                     f"within {timeout_s} s")
            try:
                yield self.next(left)
            except StopIteration:
                return

    def cancel(self, timeout_s: float = 10.0) -> CancelState:
        """Cancel the task: iteration stops, ``result()`` raises CancelledError, and the
        task's next ``emit`` raises TaskCancelled. Returns where the task was."""
        with self._cond:
            if self.future.done() and not self._buffer:
                return CancelState.FINISHED
            self._cancelled = True
            self._buffer.clear()
            self._buffered_bytes = 0
            self._cond.notify_all()
        self._table.remove(self.stream_id)
        return self._canceller(self.future, timeout_s)

    @property
    def done(self) -> bool:
        return self.future.done() and not self._buffer

    def __enter__(self) -> TaskStream:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.future.done():
            self.cancel()

"""A reply on its way: a ``concurrent.futures.Future`` whose value is unpickled in the
waiting thread, never on the I/O thread.

A RESULT reply completes the future with the raw message; ``result()`` decodes it once, in
the caller's thread. An ERROR reply completes it with the ``RemoteError`` itself, so
``exception()`` returns it and ``concurrent.futures.wait(..., FIRST_EXCEPTION)`` returns
early; the original exception (which may need the user's modules) is unpickled and chained
as ``__cause__`` only when someone looks at it.
"""
from __future__ import annotations

import math
import numbers
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable

from actorpy.errors import (ActorpyError, ActorpyTimeout, ConfigError, NodeLost, ProtocolError,
                            RemoteError, SerializationError)
from actorpy.ids import NodeId
from actorpy.runtime import remote
from actorpy.wire import message as wm


def wait_limit(timeout: float | None) -> float | None:
    """``timeout`` as a lock can wait it: a lock waits at most ``threading.TIMEOUT_MAX``
    (~292 years) and raises OverflowError past it, so a longer one (``inf``, ``1e10``) means
    no limit, as it does in fact.

    Raises:
        ConfigError: ``timeout`` is NaN (it would time out at once, or never).
    """
    if timeout is None:
        return None
    if math.isnan(timeout):
        raise ConfigError("timeout must be a number of seconds or None, got nan")
    return None if timeout >= threading.TIMEOUT_MAX else timeout


def check_seconds(name: str, value: Any) -> None:
    """Refuse a time limit that is not a number (a str failed as a TypeError deep in the
    call) or is NaN (a map timed out at once, as if the work had been too slow; a stream
    waited without limit).

    Raises:
        ConfigError: naming the argument and the value given.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise ConfigError(f"{name} must be a number of seconds, got {value!r}")


class ReplyFuture(Future):
    """A reply on its way. ``result()`` unpickles it in the calling thread and raises
    ``RemoteError`` when the remote side failed (``NodeLost`` if the node died or answered
    that it is closing, ``ActorpyTimeout`` at the request's deadline or the caller's
    timeout)."""

    def __init__(self, dest: NodeId, what: str, io_thread: threading.Thread | None = None,
                 timeout_s: float | None = None) -> None:
        super().__init__()
        self.dest = dest
        self.what = what
        #: set by the node's request table
        self.request_id = 0
        #: the request's own deadline, in seconds from sending (None: none)
        self.timeout_s = timeout_s
        self._io_thread = io_thread
        #: a direct request's (set by the node): ``waiter({self}, timeout)`` reads the
        #: calling thread's socket until this is done or the time runs out
        self.waiter: Callable[[set[ReplyFuture], float | None], object] | None = None
        self._owner = threading.get_ident()
        self._lock = threading.Lock()
        self._decoded = False
        self._value: Any = None
        self._failure: remote.RemoteFailure | None = None

    # ------------------------------------------------------------- completed by the node
    def set_reply(self, msg: wm.Message) -> None:
        """Complete with a RESULT message (decoded later, by whoever asks)."""
        if not self.done():
            self.set_result(msg)

    def set_failure(self, msg: wm.Message) -> None:
        """Complete with an ERROR message: a ``RemoteError`` (small; decoded here)."""
        try:
            failure = msg.payload()
        except Exception as exc:  # noqa: BLE001 - anything a bad pickle raises
            failure = exc
        error: BaseException
        if isinstance(failure, remote.RemoteFailure) and failure.lost_node == self.dest:
            # the node asked answers that it is going away (closing): a loss, as a death is
            error = NodeLost(self.dest, failure.message)
        elif isinstance(failure, remote.RemoteFailure):
            self._failure = failure
            error = remote.rebuild(failure, with_cause=False)
        else:
            error = ProtocolError(f"{self.dest} answered {self.what} with a malformed error "
                                  f"({type(failure).__name__})")
        if not self.done():
            self.set_exception(error)

    # ------------------------------------------------------------- read by the caller
    def result(self, timeout: float | None = None) -> Any:
        self._check_thread()
        timeout = self._pump(wait_limit(timeout))
        try:
            msg = super().result(timeout)
        except (TimeoutError, FutureTimeout) as exc:  # distinct classes before Python 3.11
            if isinstance(exc, ActorpyTimeout):
                raise
            raise ActorpyTimeout(f"{self.what} on {self.dest} got no reply within {timeout} s; "
                                 "raise the timeout_s, or check the node's log") from None
        except RemoteError as exc:
            self._attach_cause(exc)
            raise
        with self._lock:
            if not self._decoded:
                self._value = self._decode(msg)
                self._decoded = True
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._check_thread()
        timeout = self._pump(wait_limit(timeout))
        try:
            exc = super().exception(timeout)
        except (TimeoutError, FutureTimeout):
            raise ActorpyTimeout(f"{self.what} on {self.dest} got no reply within {timeout} s; "
                                 "raise the timeout_s, or check the node's log") from None
        if isinstance(exc, RemoteError):
            self._attach_cause(exc)
        return exc

    def _check_thread(self) -> None:
        if not self.done() and threading.current_thread() is self._io_thread:
            raise ActorpyError(f"waiting for {self.what} on the node's I/O thread would deadlock: "
                               "handlers and node-lost listeners must not block")

    def _pump(self, timeout: float | None) -> float | None:
        """A direct request waited on by the thread that sent it: read its socket until the
        reply is in or ``timeout`` ran out (then 0 is left to wait)."""
        if self.waiter is None or self.done() or threading.get_ident() != self._owner:
            return timeout
        self.waiter({self}, timeout)
        return timeout if self.done() else 0

    def _attach_cause(self, error: RemoteError) -> None:
        with self._lock:
            failure, self._failure = self._failure, None
        if failure is not None and error.__cause__ is None:
            cause = remote.rebuild_cause(failure)
            if cause is not None:
                error.__cause__ = cause

    def _decode(self, msg: wm.Message) -> Any:
        try:
            return msg.payload()
        except ProtocolError:
            raise
        except Exception as exc:  # noqa: BLE001 - unpickling can raise nearly anything
            raise SerializationError(
                f"the result of {self.what} from {self.dest} arrived but could not be unpickled "
                f"here: {type(exc).__name__}: {exc}. The driver needs every class the result "
                "holds: make its module importable here (install it or add it to PYTHONPATH), "
                "or return plain types") from exc

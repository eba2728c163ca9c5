"""Remote failures: captured where they happen, rebuilt as RemoteError where they surface.

What travels is bounded: a message (and each piece of the traceback text) keeps its first and
last ``KEEP_CHARS`` characters and says how many it lost, and the exception itself travels
only when it pickles to at most ``MAX_PICKLED_BYTES`` (else a copy of the same type with the
cut message, where one can be made). A callback's ``raise ValueError("x" * 50_000_000)``
reached the driver as a 100 MB RemoteError text, with 800 MB of memory, and printed it all.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass

import cloudpickle

from actorpy.errors import NodeLost, RemoteError
from actorpy.wire import serde


#: characters a message keeps from its start, and again from its end, when cut
KEEP_CHARS = 4096
#: the most characters of traceback text that travel (its frames, then the message)
MAX_TRACEBACK_CHARS = 64 * 1024
#: the largest pickled exception that travels as the RemoteError's cause
MAX_PICKLED_BYTES = 1 << 20


def cut(text: str, keep: int = KEEP_CHARS) -> str:
    """``text`` with its middle cut out when it is longer than ``2 * keep`` characters,
    saying how much was cut.

    >>> print(cut("a" * 5 + "b" * 10 + "c" * 5, keep=5))
    aaaaa
    [... 10 of 20 characters cut ...]
    ccccc
    """
    if len(text) <= 2 * keep:
        return text
    return (f"{text[:keep]}\n[... {len(text) - 2 * keep:,} of {len(text):,} characters cut "
            f"...]\n{text[-keep:]}")


def _traceback_text(kind: type[BaseException], exc: BaseException) -> str:
    """The traceback as text, each frame or message cut (``cut``), then the whole."""
    parts = traceback.format_exception(kind, exc, exc.__traceback__)
    return cut("".join(cut(part) for part in parts), MAX_TRACEBACK_CHARS // 2)


@dataclass(frozen=True)
class RemoteFailure:
    """What travels back when a task or service call raises."""

    type_name: str
    message: str
    traceback: str
    node_id: str
    pickled: bytes | None  # the exception itself, when it pickles
    #: the node a NodeLost names (read by the caller's I/O thread, which unpickles nothing)
    lost_node: str | None = None


def capture(exc: BaseException, node_id: str) -> RemoteFailure:
    """Describe ``exc`` for the caller; keeps the exception itself when it pickles."""
    if isinstance(exc, RemoteError):  # already remote: pass the original fields along,
        # and the original itself where it was rebuilt here (a service's name refused by
        # the manager reached its starter with no exception to test for)
        cause = exc.__cause__
        return RemoteFailure(exc.remote_type, cut(exc.remote_message),
                             cut(exc.remote_traceback, MAX_TRACEBACK_CHARS // 2), exc.node_id,
                             None if cause is None else _pickled(cause))
    kind = type(exc)
    name = (kind.__qualname__ if kind.__module__ == "builtins"
            else f"{kind.__module__}.{kind.__qualname__}")
    try:
        message = str(exc)
    except Exception as why:  # a broken __str__ must not hide the failure itself
        message = f"<str() of the exception raised {type(why).__name__}>"
    return RemoteFailure(name, cut(message), _traceback_text(kind, exc), node_id,
                         _pickled(exc, message),
                         exc.node_id if isinstance(exc, NodeLost) else None)


def _pickled(exc: BaseException, message: str | None = None) -> bytes | None:
    """``exc`` pickled, if it pickles to at most ``MAX_PICKLED_BYTES``; else, where
    ``message`` is given and was cut, ``exc``'s type built from the cut message
    (``ValueError(text)``), if that is what it then says."""
    try:
        data = cloudpickle.dumps(exc, protocol=5)
    except Exception:  # an exception holding unpicklable state still reports its text
        data = None
    if data is not None and len(data) <= MAX_PICKLED_BYTES:
        return data
    if message is None or len(message) <= 2 * KEEP_CHARS:
        return None
    try:
        short = type(exc)(cut(message))
        if str(short) != cut(message):   # a type whose arguments are not its message
            return None
        data = cloudpickle.dumps(short, protocol=5)
    except Exception:
        return None
    return data if len(data) <= MAX_PICKLED_BYTES else None


def rebuild(failure: RemoteFailure, with_cause: bool = True) -> RemoteError:
    """The RemoteError to raise, with the original exception chained as its cause (unless
    ``with_cause`` is False: unpickling it may import user modules, so the I/O thread
    leaves that to ``rebuild_cause`` in the thread that looks at the error)."""
    error = RemoteError(failure.type_name, failure.message, failure.traceback, failure.node_id)
    if with_cause:
        cause = rebuild_cause(failure)
        if cause is not None:
            error.__cause__ = cause
    return error


def rebuild_cause(failure: RemoteFailure) -> BaseException | None:
    """The original exception, when it was pickled and can be rebuilt here."""
    if failure.pickled is None:
        return None
    try:
        original = serde.loads(failure.pickled)
    except Exception:  # the class may not exist here; the text still says everything
        return None
    return original if isinstance(original, BaseException) else None

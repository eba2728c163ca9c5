"""Remote failures: captured where they happen, rebuilt as RemoteError where they surface."""
from __future__ import annotations

import traceback
from dataclasses import dataclass

import cloudpickle

from actorpy.errors import NodeLost, RemoteError
from actorpy.wire import serde


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
        return RemoteFailure(exc.remote_type, exc.remote_message, exc.remote_traceback,
                             exc.node_id, None if cause is None else _pickled(cause))
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = "".join(traceback.format_exception(kind, exc, exc.__traceback__))
    return RemoteFailure(name, str(exc), text, node_id, _pickled(exc),
                         exc.node_id if isinstance(exc, NodeLost) else None)


def _pickled(exc: BaseException) -> bytes | None:
    try:
        return cloudpickle.dumps(exc, protocol=5)
    except Exception:  # an exception holding unpicklable state still reports its text
        return None


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

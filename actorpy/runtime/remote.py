"""Remote failures: captured where they happen, rebuilt as RemoteError where they surface."""
from __future__ import annotations

import traceback
from dataclasses import dataclass

import cloudpickle

from actorpy.errors import RemoteError
from actorpy.wire import serde


@dataclass(frozen=True)
class RemoteFailure:
    """What travels back when a task or service call raises."""

    type_name: str
    message: str
    traceback: str
    node_id: str
    pickled: bytes | None  # the exception itself, when it pickles


def capture(exc: BaseException, node_id: str) -> RemoteFailure:
    """Describe ``exc`` for the caller; keeps the exception itself when it pickles."""
    if isinstance(exc, RemoteError):  # already remote: pass the original fields along
        return RemoteFailure(exc.remote_type, exc.remote_message, exc.remote_traceback,
                             exc.node_id, None)
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = "".join(traceback.format_exception(kind, exc, exc.__traceback__))
    try:
        pickled: bytes | None = cloudpickle.dumps(exc, protocol=5)
    except Exception:  # an exception holding unpicklable state still reports its text
        pickled = None
    return RemoteFailure(name, str(exc), text, node_id, pickled)


def rebuild(failure: RemoteFailure) -> RemoteError:
    """The RemoteError to raise, with the original exception chained as its cause."""
    error = RemoteError(failure.type_name, failure.message, failure.traceback, failure.node_id)
    if failure.pickled is not None:
        try:
            original = serde.loads(failure.pickled)
        except Exception:  # the class may not exist here; the text still says everything
            original = None
        if isinstance(original, BaseException):
            error.__cause__ = original
    return error

"""What the parameter-server engine raises on purpose (all ActorpyErrors)."""
from __future__ import annotations

from actorpy.errors import ActorpyError


class ParamError(ActorpyError):
    """Base of the parameter-server engine's errors."""


class UpdateError(ParamError, ValueError):
    """An update (or a value set by ``pull``) does not fit the model: unknown key, or another
    type, shape or dtype than the key's value. The model is left untouched."""


class KeyNotLocal(ParamError, KeyError):
    """A callback on one server shard read a key that another shard holds."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


class CheckpointError(ParamError):
    """A checkpoint is missing, corrupt, or belongs to another job or model; nothing of it
    was loaded."""


class JobFailed(ParamError):
    """The job stopped without reaching its stop condition (all workers lost, timeout, a
    server shard lost with no checkpoint to restart it from)."""


class CallbackError(ParamError):
    """A server-side callback (schedule, pull, stop, barrier) raised; the original exception
    is chained as ``__cause__`` and its traceback travels with it."""

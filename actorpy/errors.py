"""Everything actorpy raises on purpose derives from ActorpyError."""
from __future__ import annotations


class ActorpyError(Exception):
    """Base of all actorpy errors.

    ``cli_message``, where set, says the same for the command line (which names its flags,
    not ``connect()``'s parameters); the ``actorpy`` command prints it instead."""

    cli_message: str | None = None


class ConfigError(ActorpyError, ValueError):
    """A setting is missing or invalid; the message names the flag or variable to fix."""


class ProtocolError(ActorpyError):
    """A message broke the wire protocol (bad version, unknown kind, truncated, oversize)."""


class AuthError(ActorpyError):
    """A peer could not be authenticated as a member of the cluster."""


class SerializationError(ActorpyError, TypeError):
    """A value could not be pickled for sending; the message names what failed."""


class NodeLost(ActorpyError):
    """The node running a task or hosting a service died or left the cluster."""

    def __init__(self, node_id: str, message: str = "") -> None:
        super().__init__(message or f"node {node_id} was lost")
        self.node_id = node_id


class ServiceError(ActorpyError):
    """A service could not take a message (see the subclasses); the message names it."""


class ServiceDead(ServiceError):
    """The service died (its thread ended on an error) or was stopped."""


class ServiceOverloaded(ServiceError):
    """The service's inbox is full (see Config.service_inbox_items / service_inbox_bytes):
    retry later, or slow down."""


class ServiceNameTaken(ServiceError):
    """Another service holds the name a service was started with."""


class ServiceNotFound(ServiceError, LookupError):
    """No service of that name is registered in the cluster."""


class TaskCancelled(ActorpyError):
    """The task was cancelled by the node that submitted it."""


class BarrierTimeout(ActorpyError, TimeoutError):
    """A barrier did not open within its timeout."""


class ActorpyTimeout(ActorpyError, TimeoutError):
    """A call did not complete within its timeout."""


class RemoteError(ActorpyError):
    """A task raised on a remote node.

    Attributes:
        remote_type: qualified name of the remote exception type.
        remote_message: str() of the remote exception.
        remote_traceback: the remote traceback, as text.
        node_id: the node where it was raised.
    The original exception, when it could be rebuilt, is chained as ``__cause__``.
    """

    def __init__(self, remote_type: str, remote_message: str, remote_traceback: str,
                 node_id: str) -> None:
        super().__init__(f"{remote_type}: {remote_message} (on node {node_id})")
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        self.node_id = node_id

    def __str__(self) -> str:
        return (f"{self.remote_type}: {self.remote_message} (on node {self.node_id})\n"
                f"--- remote traceback ---\n{self.remote_traceback.rstrip()}")

    def __reduce__(self):  # keep the fields when a RemoteError itself travels
        return (RemoteError, (self.remote_type, self.remote_message,
                              self.remote_traceback, self.node_id))


class StoreError(ActorpyError):
    """A worker's object store could not keep a block (e.g. no disk left to spill to)."""

"""Core message kinds. Engines own their kinds (their own IntEnums) under their own service id;
the core routes on ``(service, kind)`` and never lists an engine's kinds."""
from __future__ import annotations

from enum import IntEnum

PROTOCOL_VERSION = 2  # 2: the header carries from_service; pickled bodies split like buffers

#: Service id of the core runtime. Services hosted on a node get ids >= 1.
CORE_SERVICE = 0


class Kind(IntEnum):
    """Messages of the core runtime (service 0)."""

    REGISTER = 1        # node -> manager: {role, address, pid, host, slots}
    HEARTBEAT = 3       # node -> manager
    HEARTBEAT_ACK = 4   # manager -> node
    NODE_JOINED = 5     # manager -> all: (node id, address, role, slots)
    NODE_DEAD = 6       # manager -> all: (node id, reason, "dead" or "left")
    LIST_NODES = 7      # any -> manager: request a status table
    TASK = 8            # driver -> worker: run a task, reply RESULT or ERROR
    RESULT = 9          # reply carrying a value
    ERROR = 10          # reply carrying a remote failure
    FETCH = 11          # worker -> worker: an object from the peer's local store
    SERVICE_START = 12  # driver -> worker: construct a long-lived service
    SERVICE_STOP = 13   # driver -> worker: stop a service
    LEAVE = 14          # node -> manager: leaving on purpose
    SHUTDOWN = 15       # manager -> node: exit now
    LOOKUP = 16         # node -> manager: where does a node listen?
    SERVICE_DIED = 17   # host -> the node that started a service: (ServiceRef, reason)
    NAME_BIND = 18      # host -> manager: (name, service id) -> ServiceRef, ERROR if taken
    NAME_UNBIND = 19    # host -> manager: (name, service id), a cast
    NAME_LOOKUP = 20    # any -> manager: name -> ServiceRef or None
    CANCEL = 21         # submitter -> worker: request id of a task -> CancelState value
    STREAM_ITEM = 22    # worker -> submitter: one emitted item (request_id: the stream id)
    STREAM_CREDIT = 23  # submitter -> worker: (items, bytes) consumed (request_id: stream id)


#: the kinds that answer a request (of CORE_SERVICE): they resolve the asker's future
REPLY_KINDS = frozenset({int(Kind.RESULT), int(Kind.ERROR)})


def is_reply(service: int, kind: int) -> bool:
    """Whether a message of ``service`` and ``kind`` answers a request.

    >>> (is_reply(CORE_SERVICE, Kind.RESULT), is_reply(CORE_SERVICE, Kind.TASK),
    ...  is_reply(5, Kind.ERROR))
    (True, False, False)
    """
    return service == CORE_SERVICE and kind in REPLY_KINDS

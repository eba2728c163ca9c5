"""Who a node knows and what happened to them: ``Peer`` records, membership events
(JOINED / LEFT / DEAD with role and reason) and the listeners that receive them."""
from __future__ import annotations

import enum
import itertools
import logging
from dataclasses import dataclass
from typing import Callable

from actorpy.ids import NodeId

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Peer:
    node_id: NodeId
    address: str
    role: str
    slots: int = 1  # tasks the node runs at once (workers); 1 for the rest


class NodeEventKind(enum.Enum):
    JOINED = "joined"   # first seen (joined the cluster, or already there when we joined)
    LEFT = "left"       # left on purpose
    DEAD = "dead"       # declared dead (by the manager, or by us)


@dataclass(frozen=True)
class NodeEvent:
    """A change in membership, as this node learned it."""

    kind: NodeEventKind
    node_id: NodeId
    role: str
    reason: str = ""


class Subscription:
    """What ``Node.subscribe`` returns: ``cancel()`` stops the deliveries (idempotent)."""

    def __init__(self, listeners: dict[int, Callable[[NodeEvent], None]], key: int) -> None:
        self._listeners, self._key = listeners, key

    def cancel(self) -> None:
        self._listeners.pop(self._key, None)


class Listeners:
    """Membership listeners: a raising one is logged and the others still run."""

    def __init__(self) -> None:
        self._listeners: dict[int, Callable[[NodeEvent], None]] = {}
        self._ids = itertools.count()

    def subscribe(self, listener: Callable[[NodeEvent], None]) -> Subscription:
        key = next(self._ids)
        self._listeners[key] = listener
        return Subscription(self._listeners, key)

    def publish(self, event: NodeEvent) -> None:
        for listener in list(self._listeners.values()):
            try:
                listener(event)
            except Exception:  # one broken listener must not silence the others
                log.exception("a membership listener failed on %s", event)

"""What the service tests share: two in-process nodes with their service hosts (``Side``;
the ``pair`` fixture in conftest.py builds them), the message kinds they use, and the
services more than one test file starts (``Echo``, ``Holder``)."""
from __future__ import annotations

import threading
from typing import Any

from actorpy.ids import NodeId
from actorpy.runtime.context import Caller, ServiceRef
from actorpy.runtime.host import ServiceHost
from actorpy.runtime.node import Node
from actorpy.runtime.service import Envelope, Service, ServiceContext, handles

PING, ASK, TIMER, LOG, ECHO, HOLD, DIE, BAD, BLOCK_CALL, POST = range(1, 11)
A, B = NodeId("a"), NodeId("b")


class Side(Caller):
    """One in-process node with its service host, used like a driver."""

    def __init__(self, node: Node, host: ServiceHost) -> None:
        self.node, self.services = node, host

    def start(self, factory: Any, *args: Any, on: NodeId | None = None,
              **kwargs: Any) -> ServiceRef:
        return self.start_service(factory, *args, node=on or self.node.node_id, timeout_s=10,
                                  **kwargs)


def where() -> str:
    return threading.current_thread().name


class Echo(Service):
    @handles(ECHO)
    def echo(self, value: Any, env: Envelope) -> Any:
        return (value, env.sender, env.from_service)

    @handles(PING)
    def ping(self, value: Any, env: Envelope) -> None:
        self.seen = getattr(self, "seen", []) + [(env.sender, env.from_service, value)]

    @handles(LOG)
    def log(self, _: None, env: Envelope) -> Any:
        return getattr(self, "seen", [])


class Holder(Service):
    """Keeps every HOLD request unanswered; RELEASE (PING) answers them all."""

    def __init__(self, ctx: ServiceContext) -> None:
        super().__init__(ctx)
        self.waiting: list[Any] = []

    @handles(HOLD)
    def hold(self, _: Any, env: Envelope) -> None:
        self.waiting.append(env.defer())

    @handles(PING)
    def release(self, value: Any, env: Envelope) -> int:
        for reply in self.waiting:
            reply.send(value)
        n, self.waiting = len(self.waiting), []
        return n

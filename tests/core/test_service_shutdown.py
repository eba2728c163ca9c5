"""A node that closes under a service's callback: the callback's failing send is the
shutdown, logged at DEBUG, not an ERROR with a traceback (64 P2P peers on 16 workers logged
one in about 1 of 4 shutdowns)."""
from __future__ import annotations

import logging
import shutil
import threading

from actorpy.config import Config
from actorpy.errors import NodeLost
from actorpy.ids import NodeId
from actorpy.runtime.host import ServiceHost
from actorpy.runtime.node import Node
from actorpy.runtime.service import Envelope, Service, ServiceContext, handles
from actorpy.wire.auth import Security, private_dir
from tests.conftest import wait_until
from tests.core.test_services import Side

KICK = 1


class LateSender(Service):
    """On KICK, posts a callback that says it runs (``running``), waits for ``go`` and then
    casts to itself."""

    def __init__(self, ctx: ServiceContext, running: threading.Event, go: threading.Event,
                 outcome: list[BaseException]) -> None:
        super().__init__(ctx)
        self.running, self.go, self.outcome = running, go, outcome

    @handles(KICK)
    def kick(self, _: object, env: Envelope) -> None:
        self.ctx.post(self._later)

    def _later(self) -> None:
        self.running.set()
        self.go.wait(10)
        try:
            self.ctx.cast(self.ctx.ref, KICK, None)
        except BaseException as exc:
            self.outcome.append(exc)
            raise
        finally:
            self.running.clear()


def test_a_send_from_a_callback_after_the_node_closed_is_no_error(caplog):
    folder = private_dir()
    node = Node(NodeId("a"), f"ipc://{folder}/a", Security.ipc(), linger_ms=0)
    host = ServiceHost(node, Config(), names=False, max_services=2)
    node.start()
    running, go, outcome = threading.Event(), threading.Event(), []
    try:
        side = Side(node, host)
        ref = side.start(LateSender, running, go, outcome)
        side.cast(ref, KICK)
        assert running.wait(10)
        with caplog.at_level(logging.DEBUG, logger="actorpy.runtime.runner"):
            node.close()
            go.set()
            wait_until(lambda: not running.is_set(), 10, "the callback's end")
            host.close()
        assert outcome and isinstance(outcome[0], NodeLost)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [], [r.getMessage() for r in errors]
        assert any("ran as its node closed" in r.getMessage() for r in caplog.records)
    finally:
        go.set()
        host.close()
        node.close()
        shutil.rmtree(folder, ignore_errors=True)

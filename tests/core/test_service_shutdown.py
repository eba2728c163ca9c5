"""A node that closes under a service's callback or cast handler: the failing send is the
shutdown, logged at DEBUG, not an ERROR with a traceback (64 P2P peers on 16 workers logged
one in about 1 of 4 shutdowns; 300 peers killed by SIGTERM, about 1000 lines)."""
from __future__ import annotations

import logging
import shutil
import threading

import pytest

from actorpy.config import Config
from actorpy.errors import NodeLost
from actorpy.ids import NodeId
from actorpy.runtime.host import ServiceHost
from actorpy.runtime.node import Node
from actorpy.runtime.service import Envelope, Service, ServiceContext, handles
from actorpy.wire.auth import Security, private_dir
from tests.conftest import wait_until
from tests.core.service_pair import Side

KICK, LATE, ANSWER = 1, 2, 3


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

    @handles(LATE)
    def late(self, _: object, env: Envelope) -> None:
        self._later()      # in the handler of a cast, not in a callback

    @handles(ANSWER)
    def answer(self, _: object, env: Envelope) -> int:
        self.running.set()      # a call's handler: its reply is the send that fails
        self.go.wait(10)
        self.running.clear()
        return 1

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


@pytest.mark.parametrize("kind", [KICK, LATE, ANSWER],
                         ids=["callback", "cast-handler", "call-handler"])
def test_a_send_after_the_node_closed_is_no_error(caplog, kind):
    folder = private_dir()
    node = Node(NodeId("a"), f"ipc://{folder}/a", Security.ipc(), linger_ms=0)
    host = ServiceHost(node, Config(), names=False, max_services=2)
    node.start()
    running, go, outcome = threading.Event(), threading.Event(), []
    try:
        side = Side(node, host)
        ref = side.start(LateSender, running, go, outcome)
        if kind == ANSWER:    # before: an ERROR with two tracebacks ("could not send its
            side.call_async(ref, kind, None)   # error"), as workers logged at a lost manager
        else:
            side.cast(ref, kind)
        assert running.wait(10)
        with caplog.at_level(logging.DEBUG):
            node.close()
            go.set()
            wait_until(lambda: not running.is_set(), 10, "the callback's end")
            host.close()
        assert kind == ANSWER or outcome and isinstance(outcome[0], NodeLost)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [], [r.getMessage() for r in errors]
        assert any("as its node closed" in r.getMessage() for r in caplog.records)
    finally:
        go.set()
        host.close()
        node.close()
        shutil.rmtree(folder, ignore_errors=True)

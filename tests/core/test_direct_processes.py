"""Direct replies between real processes: a task's direct request to a service on another
worker is answered on the task thread's own socket (its node's ROUTER takes nothing), and a
task waiting on a worker that is SIGKILLed gets NodeLost within the death bound."""
from __future__ import annotations

import os
import signal
import time
from typing import Any

import actorpy
from actorpy.config import Config
from actorpy.runtime.service import Envelope, Service, ServiceContext, handles
from actorpy.runtime.tasks import ContextCallTask
from tests.conftest import wait_until

ECHO, HOLD, COUNT = 1, 2, 3


class Holder(Service):
    """Answers ECHO at once and never answers HOLD (handled on the I/O thread)."""

    quick_kinds = frozenset({ECHO, HOLD, COUNT})

    def __init__(self, ctx: ServiceContext) -> None:
        super().__init__(ctx)
        self.held: list[Any] = []

    @handles(ECHO)
    def echo(self, value: Any, env: Envelope) -> Any:
        return value

    @handles(HOLD)
    def hold(self, _: None, env: Envelope) -> None:
        self.held.append(env.defer())

    @handles(COUNT)
    def count(self, _: None, env: Envelope) -> int:
        return len(self.held)


def ask(ctx: Any, ref: Any, kind: int, payload: Any, timeout_s: float) -> tuple[str, Any, int]:
    """A direct request from this task's thread: (outcome, value or error, bytes that came
    in through the node's ROUTER meanwhile)."""
    before = ctx.node.bytes_in
    fut = ctx.call_async(ref, kind, payload, direct=True)
    ctx.node.wait([fut], timeout_s)
    try:
        return "value", fut.result(0), ctx.node.bytes_in - before
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return type(exc).__name__, str(exc), ctx.node.bytes_in - before


def test_a_direct_wait_on_a_killed_worker_fails_within_the_death_bound():
    config = Config()
    with actorpy.connect(workers=2) as cluster:
        a, b = cluster.workers()
        pids = {r["node_id"]: r["pid"] for r in cluster.nodes()}
        ref = cluster.start_service(Holder, node=b, timeout_s=30)
        outcome, value, _ = cluster.submit_task(ContextCallTask(ask, (ref, ECHO, 1, 30)),
                                                a).result(60)
        assert (outcome, value) == ("value", 1)
        # Now the thread's socket is up: a reply takes nothing from the ROUTER of a's node
        # (heartbeats and membership news may, hence the retries).
        took = [cluster.submit_task(ContextCallTask(ask, (ref, ECHO, i, 30)), a).result(60)
                for i in range(5)]
        assert [t[:2] for t in took] == [("value", i) for i in range(5)]
        assert min(t[2] for t in took) == 0
        task = cluster.submit_task(ContextCallTask(ask, (ref, HOLD, None, 120)), a)
        wait_until(lambda: cluster.call(ref, COUNT, timeout_s=10) == 1, 30,
                   "the held request to reach the service")
        os.kill(pids[b], signal.SIGKILL)
        killed = time.monotonic()
        outcome, text, _ = task.result(120)
        waited = time.monotonic() - killed
        assert outcome == "NodeLost", text
        bound = config.dead_after_s + 2 * config.heartbeat_interval_s
        assert waited < bound + 10, f"the waiter heard of the death after {waited:.1f} s"

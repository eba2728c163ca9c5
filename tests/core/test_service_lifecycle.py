"""A service's lifetime (two nodes over ipc, no manager): timers cancel, stopping ends
timers and event subscriptions, dying services are reported, service ids are reused and
inboxes have a high-water mark."""
from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from actorpy.errors import RemoteError, ServiceDead, ServiceOverloaded
from actorpy.ids import NodeId
from actorpy.runtime.node import NodeEventKind
from actorpy.runtime.service import Envelope, Service, ServiceContext, handles
from actorpy.wire.auth import private_dir
from tests.conftest import wait_until
from tests.core.service_pair import A, B, BAD, DIE, ECHO, HOLD, LOG, Echo


class TestTimersAndEvents:
    def test_cancelled_timers_never_run(self, pair):
        a, _ = pair
        fired: list[str] = []
        done = threading.Event()

        class Timers(Service):
            def __init__(self, ctx: ServiceContext) -> None:
                super().__init__(ctx)
                ctx.schedule(0.05, fired.append, "cancelled-now").cancel()
                self.later = ctx.schedule(0.1, fired.append, "cancelled-by-first")
                ctx.schedule(0.0, self.first)
                ctx.schedule(0.2, self.last)

            def first(self) -> None:
                fired.append("first")
                self.later.cancel()

            def last(self) -> None:
                fired.append("last")
                done.set()
        a.start(Timers)
        assert done.wait(10)
        assert fired == ["first", "last"]

    def test_stop_cancels_timers_and_subscriptions(self, pair):
        a, _ = pair
        fired = threading.Event()
        before = len(a.node._dir.events._listeners)

        class Watcher(Service):
            def __init__(self, ctx: ServiceContext) -> None:
                super().__init__(ctx)
                self.events: list[Any] = []
                ctx.subscribe(lambda ev: self.events.append((ev.kind, ev.node_id, ev.role)))
                ctx.schedule(0.3, fired.set)

            @handles(LOG)
            def log(self, _: None, env: Envelope) -> Any:
                return self.events
        ref = a.start(Watcher)
        assert len(a.node._dir.events._listeners) == before + 1
        a.node.add_peer(NodeId("x"), f"ipc://{private_dir()}/x", "worker")
        a.node.mark_dead(NodeId("x"), "killed")
        assert a.call(ref, LOG, timeout_s=10) == [(NodeEventKind.JOINED, "x", "worker"),
                                                 (NodeEventKind.DEAD, "x", "worker")]
        assert a.stop_service(ref) is True
        wait_until(lambda: len(a.node._dir.events._listeners) == before, 5,
                   "the subscription to go")
        marker = threading.Event()
        a.node.call_later(0.5, marker.set)  # due after the service's timer would have been
        assert marker.wait(10)
        assert not fired.is_set()


class Fragile(Service):
    @handles(DIE)
    def die(self, _: None, env: Envelope) -> None:
        raise SystemExit("handler called exit")

    @handles(BAD)
    def bad(self, _: None, env: Envelope) -> None:
        raise Unprintable()

    @handles(ECHO)
    def echo(self, value: Any, env: Envelope) -> Any:
        return value


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot print me")


class TestDyingServices:
    def test_a_dead_service_is_reported_and_named_to_later_callers(self, pair, caplog):
        a, b = pair
        caplog.set_level(logging.ERROR, logger="actorpy")
        died: list[Any] = []
        a.on_service_died(died.append)
        ref = a.start(Fragile, on=B)  # owned by a, hosted on b
        queued = [a.call_async(ref, ECHO, i) for i in range(2)]
        with pytest.raises(RemoteError, match="SystemExit") as info:
            a.call(ref, DIE, timeout_s=10)
        assert [f.result(10) for f in queued] == [0, 1]
        wait_until(lambda: died, 10, "the owner to hear of the death")
        assert died[0].ref == ref and "handler called exit" in died[0].reason
        with pytest.raises(RemoteError, match=f"id {ref.service}. on b died") as info:
            a.call(ref, ECHO, 1, timeout_s=10)  # at once, not after the timeout
        assert isinstance(info.value.__cause__, ServiceDead)
        assert any("died" in r.getMessage() and r.levelno == logging.ERROR
                   for r in caplog.records)

    def test_an_error_that_cannot_be_reported_still_answers(self, pair):
        a, b = pair
        ref = b.start(Fragile)
        with pytest.raises(RemoteError, match="Unprintable"):
            a.call(ref, BAD, timeout_s=10)
        assert a.call(ref, ECHO, "alive", timeout_s=10) == "alive"


class TestIdsAndInbox:
    def test_ids_are_reused_and_a_full_node_says_so(self, pair):
        a, b = pair
        refs = [b.start(Echo) for _ in range(3)]
        assert [r.service for r in refs] == [1, 2, 3]
        with pytest.raises(RemoteError, match="already runs 3 services"):
            a.start(Echo, on=B)
        assert a.stop_service(refs[1]) is True
        with pytest.raises(RemoteError, match="was stopped"):
            a.call(refs[1], ECHO, 1, timeout_s=10)
        again = a.start(Echo, on=B)
        assert again.service == refs[1].service
        assert a.call(again, ECHO, 1, timeout_s=10)[0] == 1

    @pytest.mark.parametrize("pair", [4], indirect=True)
    def test_a_full_inbox_refuses_at_once_and_never_blocks_the_node(self, pair, caplog):
        a, b = pair
        gate, entered = threading.Event(), threading.Event()

        class Slow(Service):
            @handles(HOLD)
            def hold(self, _: None, env: Envelope) -> str:
                entered.set()
                gate.wait(30)
                return "held"

            @handles(ECHO)
            def echo(self, value: Any, env: Envelope) -> Any:
                return value
        slow, echo = b.start(Slow), b.start(Echo)
        first = a.call_async(slow, HOLD)
        box = b.services.mailbox(slow.service)
        assert entered.wait(10), "the first HOLD was never taken"
        queued = [a.call_async(slow, ECHO, i) for i in range(4)]  # the high-water mark
        wait_until(lambda: len(box) == 4, 5, "four queued")
        caplog.set_level(logging.WARNING, logger="actorpy")
        with pytest.raises(RemoteError, match="overloaded") as info:
            a.call(slow, ECHO, 99, timeout_s=10)
        assert isinstance(info.value.__cause__, ServiceOverloaded)
        a.cast(slow, ECHO, 100)
        wait_until(lambda: any("dropped a cast" in r.getMessage() for r in caplog.records), 5,
                   "a warning for the dropped cast")
        assert a.call(echo, ECHO, "other", timeout_s=10) == ("other", A, 0)  # node serves
        gate.set()
        assert first.result(10) == "held"
        assert [f.result(10) for f in queued] == [0, 1, 2, 3]
        assert box.refused == 2 and box.peak_messages == 4

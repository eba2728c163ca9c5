"""Services in one process (two nodes over ipc, no manager): everything reaches a service on
its own thread and in order, quick kinds on the I/O thread, the sender's service id, and
dispatch on kinds (unknown kinds, errors, handlers inherited and overridden)."""
from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from actorpy.errors import ActorpyError, RemoteError
from actorpy.ids import NodeId
from actorpy.runtime.context import ServiceRef
from actorpy.runtime.node import NodeEventKind
from actorpy.runtime.service import Envelope, Service, ServiceContext, handles
from actorpy.wire.auth import private_dir
from tests.conftest import wait_until
from tests.core.service_pair import A, ASK, B, ECHO, LOG, PING, POST, TIMER, Echo, where


class Recorder(Service):
    """Records what reaches it and on which thread."""

    def __init__(self, ctx: ServiceContext, peer: ServiceRef | None) -> None:
        super().__init__(ctx)
        self.peer = peer
        self.log: list[tuple[Any, ...]] = [("init", None, where())]
        ctx.subscribe(lambda ev: self.log.append(("event", (ev.kind, ev.node_id), where())))

    @handles(PING)
    def ping(self, n: int, env: Envelope) -> None:
        self.log.append(("msg", n, where()))

    @handles(ASK)
    def ask(self, n: int, env: Envelope) -> None:
        assert self.peer is not None
        self.ctx.request(self.peer, ECHO, n, timeout_s=10,
                         on_reply=lambda fut: self.log.append(("reply", fut.result()[0], where())))

    @handles(TIMER)
    def timer(self, delay: float, env: Envelope) -> None:
        self.ctx.schedule(delay, lambda: self.log.append(("timer", delay, where())))

    @handles(POST)
    def post(self, n: int, env: Envelope) -> None:
        self.ctx.post(lambda: self.log.append(("posted", n, where())))
        self.log.append(("msg", -n, where()))   # the posted call runs after this handler

    @handles(LOG)
    def get_log(self, _: None, env: Envelope) -> list[tuple[Any, ...]]:
        return list(self.log)


class TestOwnThreadInOrder:
    def test_messages_replies_timers_events_on_the_service_thread(self, pair):
        a, b = pair
        echo = b.start(Echo)
        rec = a.start(Recorder, echo)
        for i in range(50):
            b.cast(rec, PING, i)
        b.cast(rec, ASK, 7)
        log = lambda: a.call(rec, LOG, timeout_s=10)  # noqa: E731
        wait_until(lambda: any(e[0] == "reply" for e in log()), 10, "the reply to ASK")
        b.cast(rec, TIMER, 0.0)
        wait_until(lambda: any(e[0] == "timer" for e in log()), 10, "the timer")
        b.cast(rec, POST, 9)
        wait_until(lambda: any(e[0] == "posted" for e in log()), 10, "the posted call")
        a.node.add_peer(NodeId("c"), f"ipc://{private_dir()}/c", "worker")  # posts JOINED now
        b.cast(rec, PING, 50)  # sent after the event was posted: must come after it
        wait_until(lambda: log()[-1][:2] == ("msg", 50), 10, "the last message")
        entries = log()
        threads = {e[2] for e in entries}
        assert len(threads) == 1 and threads.pop().startswith("actorpy-service-")
        assert [e[1] for e in entries if e[0] == "msg"] == list(range(50)) + [-9, 50]
        assert [e[:2] for e in entries if e[0] != "msg"] == [
            ("init", None), ("reply", 7), ("timer", 0.0), ("posted", 9),
            ("event", (NodeEventKind.JOINED, "c"))]
        assert entries[-2][0] == "event"

    def test_the_sender_service_id_is_seen_by_the_receiver(self, pair):
        a, b = pair
        sink = b.start(Echo)
        local = a.start(Echo)  # same node as the senders: loopback, no socket

        class Peer(Service):
            @handles(PING)
            def go(self, target: ServiceRef, env: Envelope) -> None:
                self.ctx.cast(target, PING, self.ctx.service_id)
        peers = [a.start(Peer), b.start(Peer)]
        for p in peers:
            for target in (sink, local):
                a.cast(p, PING, target)
        got = lambda ref: a.call(ref, LOG, timeout_s=10)  # noqa: E731
        wait_until(lambda: len(got(sink)) == 2 and len(got(local)) == 2, 10, "four casts")
        expected = {(A, peers[0].service, peers[0].service),
                    (B, peers[1].service, peers[1].service)}
        assert set(got(sink)) == expected and set(got(local)) == expected
        # The driver side (no service) sends as service 0.
        assert a.call(sink, ECHO, "x", timeout_s=10) == ("x", A, 0)


class QuickRecorder(Recorder):
    """PING is declared quick: it may run on the I/O thread; ASK (a request) and LOG not."""

    quick_kinds = frozenset({PING})


class TestQuickKinds:
    def test_quick_kinds_run_on_the_io_thread_one_at_a_time_in_order(self, pair):
        a, b = pair
        echo = b.start(Echo)
        rec = a.start(QuickRecorder, echo)
        log = lambda: a.call(rec, LOG, timeout_s=10)  # noqa: E731

        def a_ping_runs_on_the_io_thread() -> bool:
            before = len(log())
            b.cast(rec, PING, -1)
            wait_until(lambda: len(log()) > before, 10, "a PING")
            return log()[-1][2].startswith("actorpy-io-")
        # Idle and empty: a quick kind runs at once, on the I/O thread. One that arrives while
        # the service thread still holds the inbox (a loaded machine, right after the start)
        # runs there instead, so a few tries may be needed; none may take 10 s.
        wait_until(a_ping_runs_on_the_io_thread, 10, "a PING run on the I/O thread")
        for i in range(200):                             # a burst: some queue, all in order
            b.cast(rec, PING, i)
        b.cast(rec, ASK, 7)
        wait_until(lambda: any(e[0] == "reply" for e in log()), 10, "the reply to ASK")
        entries = log()
        assert [e[1] for e in entries if e[0] == "msg" and e[1] >= 0] == list(range(200))
        reply = next(e for e in entries if e[0] == "reply")
        assert reply[2].startswith("actorpy-service-")  # not quick: the service's thread
        a.cast(rec, PING, 200)       # from its own node: run on the sending thread itself
        assert log()[-1] == ("msg", 200, threading.current_thread().name)



class Aside(Service):
    """ECHO runs ``ctx.unlocked`` around a wait for a PING (quick); LOG says where each ran."""

    quick_kinds = frozenset({PING})

    def __init__(self, ctx: ServiceContext, after_s: float) -> None:
        super().__init__(ctx)
        self.after_s = after_s
        self.pinged = threading.Event()
        self.log: list[tuple[Any, str]] = []

    @handles(ECHO)
    def work(self, wait_s: float, env: Envelope) -> bool:
        self.pinged.clear()
        return self.ctx.unlocked(lambda: self.pinged.wait(wait_s), after_s=self.after_s)

    @handles(PING)
    def ping(self, n: int, env: Envelope) -> None:
        self.log.append((n, where()))
        if n < 0:
            self.pinged.set()

    @handles(LOG)
    def read(self, _: None, env: Envelope) -> list[tuple[Any, str]]:
        return self.log


class AsideOnly(Aside):
    """PING runs on the I/O thread only while ECHO's work is unlocked."""

    quick_kinds = frozenset()
    aside_kinds = frozenset({PING})


class TestUnlocked:
    @pytest.mark.parametrize("after_s", [0.0, 0.05])
    def test_quick_kinds_run_on_the_io_thread_while_the_service_works_unlocked(self, pair,
                                                                               after_s):
        a, b = pair
        ref = a.start(Aside, after_s)
        done: list[bool] = []
        worker = threading.Thread(target=lambda: done.append(b.call(ref, ECHO, 10.0,
                                                                    timeout_s=30)))
        worker.start()
        wait_until(lambda: ref_stepped_aside(a, ref), 10, "the service to step aside")
        for i in range(20):         # queued first while after_s has not passed: in order
            b.cast(ref, PING, i)
        b.cast(ref, PING, -1)       # ends the wait, if it runs while the service works
        worker.join(30)
        assert done == [True]       # the PINGs ran while ECHO's work waited for them
        log = a.call(ref, LOG, timeout_s=10)
        assert [n for n, _ in log] == [*range(20), -1]
        assert all(thread.startswith("actorpy-io-") for _, thread in log)

    def test_aside_kinds_run_on_the_io_thread_only_while_the_service_works_unlocked(self,
                                                                                    pair):
        a, b = pair
        ref = a.start(AsideOnly, 0.0)
        b.cast(ref, PING, 0)                            # idle: the service's own thread
        wait_until(lambda: len(a.call(ref, LOG, timeout_s=10)) == 1, 10, "the first PING")
        done: list[bool] = []
        worker = threading.Thread(target=lambda: done.append(b.call(ref, ECHO, 10.0,
                                                                    timeout_s=30)))
        worker.start()
        wait_until(lambda: ref_stepped_aside(a, ref), 10, "the service to step aside")
        for i in range(1, 6):
            b.cast(ref, PING, i)
        b.cast(ref, PING, -1)
        worker.join(30)
        assert done == [True]       # the PINGs ran while ECHO's work waited for them
        log = a.call(ref, LOG, timeout_s=10)
        assert [n for n, _ in log] == [0, *range(1, 6), -1]
        assert log[0][1].startswith("actorpy-service-")
        assert all(thread.startswith("actorpy-io-") for _, thread in log[1:])

    def test_outside_a_handler_it_just_runs_the_work(self, pair):
        a, _ = pair
        ref = a.start(Aside, 0.0)
        host = a.services
        runner = host._runners[ref.service]
        assert runner.ctx.unlocked(lambda: 42) == 42   # not the service's thread


def ref_stepped_aside(side: Any, ref: ServiceRef) -> bool:
    return side.services._runners[ref.service].mailbox._aside

class TestDispatch:
    def test_unknown_kinds_errors_and_casts(self, pair, caplog):
        a, b = pair

        class Picky(Service):
            @handles(ECHO, PING)
            def echo(self, value: Any, env: Envelope) -> Any:
                if value == "boom":
                    raise KeyError("boom")
                return value
        ref = b.start(Picky)
        assert a.call(ref, PING, 5, timeout_s=10) == 5
        with pytest.raises(RemoteError, match=f"no handler for kind {TIMER} ") as info:
            a.call(ref, TIMER, timeout_s=10)
        assert info.value.remote_type == "actorpy.errors.ProtocolError"
        with pytest.raises(RemoteError, match="KeyError") as info:
            a.call(ref, ECHO, "boom", timeout_s=10)
        assert isinstance(info.value.__cause__, KeyError)
        caplog.set_level(logging.ERROR, logger="actorpy")
        a.cast(ref, ECHO, "boom")
        wait_until(lambda: any("Picky failed on kind" in r.getMessage()
                               for r in caplog.records), 5, "the failed cast to be logged")
        assert a.call(ref, ECHO, "still", timeout_s=10) == "still"

    def test_two_handlers_for_one_kind_are_refused(self):
        with pytest.raises(ActorpyError, match="two handlers"):
            class Twice(Service):  # noqa: F841
                @handles(1)
                def one(self, _: Any, env: Envelope) -> None: ...

                @handles(1)
                def other(self, _: Any, env: Envelope) -> None: ...

    def test_subclasses_inherit_and_override_handlers(self, pair):
        a, b = pair

        class Louder(Echo):
            @handles(ECHO)
            def shout(self, value: str, env: Envelope) -> str:
                return value.upper()
        ref = b.start(Louder)
        assert a.call(ref, ECHO, "hi", timeout_s=10) == "HI"
        a.cast(ref, PING, 3)
        wait_until(lambda: a.call(ref, LOG, timeout_s=10), 5, "the inherited PING handler")

"""Services in one process (two nodes over ipc, no manager): everything reaches a service on
its own thread and in order, async requests between services never deadlock, timers
cancel, events unsubscribe, deferred replies, the sender's service id, dying services,
id reuse and inbox high-water marks."""
from __future__ import annotations

import logging
import shutil
import threading
from concurrent.futures import Future
from typing import Any

import pytest

from actorpy.config import Config
from actorpy.errors import (ActorpyError, ActorpyTimeout, NodeLost, RemoteError, ServiceDead,
                            ServiceOverloaded)
from actorpy.ids import NodeId
from actorpy.runtime.context import Caller, ServiceRef
from actorpy.runtime.host import ServiceHost
from actorpy.runtime.node import Node, NodeEventKind
from actorpy.runtime.service import Envelope, Service, ServiceContext, handles
from actorpy.wire.auth import Security, private_dir
from tests.conftest import wait_until

PING, ASK, TIMER, LOG, ECHO, HOLD, DIE, BAD, BLOCK_CALL, POST = range(1, 11)
A, B = NodeId("a"), NodeId("b")


class Side(Caller):
    """One in-process node with its service host, used like a driver."""

    def __init__(self, node: Node, host: ServiceHost) -> None:
        self.node, self.services = node, host

    def start(self, factory: Any, *args: Any, on: NodeId | None = None, **kwargs: Any) -> ServiceRef:
        return self.start_service(factory, *args, node=on or self.node.node_id, timeout_s=10,
                                  **kwargs)


@pytest.fixture
def pair(request):
    """Nodes a and b, each hosting at most 3 services whose inboxes hold ``request.param``
    messages (default 1000)."""
    folder = private_dir()
    sides = []
    for name in (A, B):
        node = Node(name, f"ipc://{folder}/{name}", Security.ipc(), linger_ms=0)
        config = Config(service_inbox_items=getattr(request, "param", 1000))
        sides.append(Side(node, ServiceHost(node, config, names=False, max_services=3)))
    a, b = sides
    for side in sides:
        side.node.start()
    a.node.add_peer(B, b.node.address, "worker")
    b.node.add_peer(A, a.node.address, "driver")
    yield a, b
    for side in sides:
        side.services.close()
        side.node.close()
    shutil.rmtree(folder, ignore_errors=True)


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
        expected = {(A, peers[0].service, peers[0].service), (B, peers[1].service, peers[1].service)}
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


class Asker(Service):
    """Answers ASK only after asking its partner (deferred reply + async request)."""

    partner: ServiceRef | None = None

    @handles(PING)
    def meet(self, partner: ServiceRef, env: Envelope) -> None:
        self.partner = partner

    @handles(ASK)
    def ask(self, n: int, env: Envelope) -> None:
        reply = env.defer()
        assert self.partner is not None
        self.ctx.request(self.partner, ECHO, n, timeout_s=10,
                         on_reply=lambda fut: reply.send(("via", fut.result()[0])))

    @handles(ECHO)
    def echo(self, n: int, env: Envelope) -> Any:
        return (n + 1, env.sender, env.from_service)

    @handles(BLOCK_CALL)
    def block_call(self, n: int, env: Envelope) -> Any:
        assert self.partner is not None
        return self.ctx.call(self.partner, BLOCK_CALL, n, timeout_s=0.5)


class TestServicesCallingEachOther:
    def test_async_requests_both_ways_never_deadlock(self, pair):
        a, b = pair
        x, y = a.start(Asker), b.start(Asker)
        a.cast(x, PING, y)
        a.cast(y, PING, x)
        # Both ASKs are in flight at once; each service asks the other before answering.
        fx, fy = a.call_async(x, ASK, 1), a.call_async(y, ASK, 2)
        assert fx.result(10) == ("via", 2) and fy.result(10) == ("via", 3)

    def test_blocking_calls_both_ways_would_deadlock(self, pair):
        a, b = pair
        x, y = a.start(Asker), b.start(Asker)
        a.cast(x, PING, y)
        a.cast(y, PING, x)
        with pytest.raises(RemoteError, match="no reply within 0.5 s"):
            a.call(x, BLOCK_CALL, 1, timeout_s=10)
        assert a.call(x, ECHO, 1, timeout_s=10)[0] == 2  # both serve again afterwards

    def test_calling_itself_blocking_is_refused(self, pair):
        a, _ = pair
        x = a.start(Asker)
        a.cast(x, PING, x)
        with pytest.raises(RemoteError, match="called itself"):
            a.call(x, BLOCK_CALL, 1, timeout_s=10)

    def test_request_deadlines_reach_on_reply_in_deadline_order(self, pair):
        a, b = pair
        holder = b.start(Holder)
        patient, impatient = Future(), Future()

        def settle(outcome: Future) -> Any:
            def done(fut: Any) -> None:
                try:
                    outcome.set_result(fut.result())
                except Exception as exc:
                    outcome.set_exception(exc)
            return done

        class Asks(Service):
            @handles(ASK)
            def ask(self, _: None, env: Envelope) -> None:
                # The later deadline is set first: the earlier one must still fire on time.
                self.ctx.request(holder, HOLD, None, timeout_s=30, on_reply=settle(patient))
                self.ctx.request(holder, HOLD, None, timeout_s=0.2, on_reply=settle(impatient))
        a.cast(a.start(Asks), ASK)
        with pytest.raises(ActorpyTimeout, match="no reply within 0.2 s"):
            impatient.result(10)
        assert not patient.done()
        assert a.call(holder, PING, "late", timeout_s=10) == 2  # both were held
        assert patient.result(10) == "late"


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


class TestDeferredReplies:
    def test_a_barrier_answers_when_all_arrived(self, pair):
        a, b = pair
        barrier = b.start(Holder)
        waiting = [a.call_async(barrier, HOLD) for _ in range(3)]
        assert not any(f.done() for f in waiting)
        assert a.call(barrier, PING, "go", timeout_s=10) == 3
        assert [f.result(10) for f in waiting] == ["go"] * 3

    def test_stopping_fails_replies_still_deferred(self, pair):
        a, b = pair
        barrier, fut = held_call(a, b)
        assert a.stop_service(barrier) is True
        with pytest.raises(RemoteError, match="was stopped") as info:
            fut.result(10)
        assert isinstance(info.value.__cause__, ServiceDead)

    def test_a_service_stopped_as_its_node_closes_is_a_lost_node_to_callers(self, pair):
        # before: RemoteError from ServiceDead("... was stopped (node b is closing)")
        a, b = pair
        barrier, fut = held_call(a, b)
        b.services.close()
        with pytest.raises(NodeLost, match="node b is closing") as waited:
            fut.result(10)
        with pytest.raises(NodeLost, match="node b is closing") as later:
            a.call(barrier, PING, "late", timeout_s=10)
        assert waited.value.node_id == later.value.node_id == B


def held_call(a, b):
    """A Holder started on ``b`` and a HOLD from ``a`` it has taken and defers: (its ref,
    the call's future)."""
    barrier = b.start(Holder)
    fut = a.call_async(barrier, HOLD)
    wait_until(lambda: b.services.mailbox(barrier.service) is not None
               and len(b.services.mailbox(barrier.service)) == 0, 5, "HOLD handled")
    return barrier, fut


class Loser(Service):
    @handles(DIE)
    def lose(self, node: str, env: Envelope) -> None:
        raise NodeLost(NodeId(node), f"node {node} is closing")


def test_only_a_node_answering_its_own_loss_is_lost_to_the_caller(pair):
    a, b = pair
    ref = b.start(Loser)
    with pytest.raises(NodeLost) as own:
        a.call(ref, DIE, B, timeout_s=10)
    assert own.value.node_id == B
    with pytest.raises(RemoteError) as other:   # b's service failed: a third node went
        a.call(ref, DIE, "c", timeout_s=10)
    assert isinstance(other.value.__cause__, NodeLost) and other.value.__cause__.node_id == "c"


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
        wait_until(lambda: len(a.node._dir.events._listeners) == before, 5, "the subscription to go")
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


"""Services calling each other (two nodes over ipc, no manager): async requests both ways
never deadlock, blocking ones would and time out, deadlines reach ``on_reply`` in order,
deferred replies, and which failures reach a caller as a lost node."""
from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from actorpy.errors import ActorpyTimeout, NodeLost, RemoteError, ServiceDead
from actorpy.ids import NodeId
from actorpy.runtime.context import ServiceRef
from actorpy.runtime.service import Envelope, Service, handles
from tests.conftest import wait_until
from tests.core.service_pair import ASK, B, BLOCK_CALL, DIE, ECHO, HOLD, PING, Holder


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


class TestDeferredReplies:
    def test_a_barrier_answers_when_all_arrived(self, pair):
        a, b = pair
        barrier = b.start(Holder)
        waiting = [a.call_async(barrier, HOLD) for _ in range(3)]
        assert not any(f.done() for f in waiting)
        assert a.call(barrier, PING, "go", timeout_s=10) == 3
        assert [f.result(10) for f in waiting] == ["go"] * 3

    def test_a_deferred_reply_on_this_node_shares_its_arrays_read_only(self, pair):
        # Reply.send's arrays never change, so a requester on the service's own node gets
        # read-only views of them (before: a copy, 4 MB a step of the 1M-float rate bench,
        # made holding the interpreter lock); a returned value is still copied, and a
        # requester elsewhere gets read-only frames of its own
        kept = np.arange(1 << 18, dtype=np.float32)
        kept.flags.writeable = False

        class Keeper(Service):
            @handles(ASK)
            def deferred(self, _: None, env: Envelope) -> None:
                env.defer().send({"w": kept})

            @handles(ECHO)
            def returned(self, _: None, env: Envelope) -> Any:
                return {"w": kept}
        a, b = pair
        here, there = a.start(Keeper), b.start(Keeper)
        shared = a.call(here, ASK, timeout_s=10)["w"]
        assert np.shares_memory(shared, kept) and not shared.flags.writeable
        copied = a.call(here, ECHO, timeout_s=10)["w"]
        assert not np.shares_memory(copied, kept) and np.array_equal(copied, kept)
        remote = a.call(there, ASK, timeout_s=10)["w"]
        assert not np.shares_memory(remote, kept) and not remote.flags.writeable
        assert np.array_equal(remote, kept)

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

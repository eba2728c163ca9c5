"""Steps ride on every message (the barrier's free information), PING refreshes one peer's
step, and CALL / REPLY carry an engine's requests with the node's retries and liveness."""
from __future__ import annotations

import random

import numpy as np
import pytest

from engines.peer.kademlia.events import Effects, KademliaConfig
from engines.peer.kademlia.ids import KadId, key_id
from engines.peer.kademlia.messages import Call
from engines.peer.kademlia.node import NO_HANDLER, KademliaNode
from engines.peer.kademlia.routing import Contact
from engines.peer.kademlia.rpc import Ping, decode, encode
from engines.peer.kademlia.sim import SimNetwork

from .conftest import FAST


class TestPiggyBackedSteps:
    def test_every_message_reports_its_senders_step(self) -> None:
        a = KademliaNode(KadId(1), "a", rng=random.Random(0))
        b = KademliaNode(KadId(2), "b", rng=random.Random(1))
        a.step, b.step = 7, 3
        eff = a.receive("b", encode(Ping(5, KadId(2), b.step)), now=1.0)
        assert a.steps.get(KadId(2)).step == 3                    # type: ignore[union-attr]
        pong = eff.sends[0].message
        assert pong.step == 7
        ping = b.ping(Contact(KadId(1), "a"), 1.0)[1].sends[0].message
        b.receive("a", a.receive("b", ping, now=1.1).sends[0].message, now=1.2)
        assert b.steps.get(KadId(1)) is not None and b.steps.get(KadId(1)).step == 7  # type: ignore

    def test_lookups_refresh_the_steps_of_the_peers_they_ask(self) -> None:
        net = SimNetwork(FAST, seed=51)
        live = net.grow(60)
        for i, address in enumerate(live):
            net.nodes[address].step = 100 + i
        done = net.find_node(live[0], random.Random(52).getrandbits(160))
        steps = net.nodes[live[0]].steps
        for contact in done.contacts:                  # every one of them answered us
            seen = steps.get(contact.node_id)
            assert seen is not None and seen.step == 100 + int(contact.address[1:])
            assert seen.seen_at >= net.clock.now() - done.elapsed_s

    def test_out_of_order_messages_never_lower_a_step(self) -> None:
        node = KademliaNode(KadId(1), "me", rng=random.Random(0))
        node.receive("a", encode(Ping(1, KadId(9), 5)), now=1.0)
        node.receive("a", encode(Ping(2, KadId(9), 4)), now=2.0)   # an older message, late
        seen = node.steps.get(KadId(9))
        assert seen is not None and (seen.step, seen.seen_at) == (5, 2.0)


class TestPing:
    def test_ping_answers_with_the_step_and_a_dead_peer_is_evicted(self) -> None:
        net = SimNetwork(FAST, seed=53)
        live = net.grow(20)
        net.nodes[live[5]].step = 42
        me = net.nodes[live[0]]
        done = net.run_op(live[0], lambda node, now: node.ping(net.contact(live[5]), now))
        assert done.contacts == (net.contact(live[5]),)
        assert me.steps.get(net.nodes[live[5]].node_id).step == 42  # type: ignore[union-attr]
        net.kill(live[5])
        start = net.clock.now()
        done = net.run_op(live[0], lambda node, now: node.ping(net.contact(live[5]), now))
        assert done.contacts == ()
        # asked again after an adaptive timeout (round trips here are 10-100 ms); the PING
        # ends with the eviction, two rpc_timeout_s after the first try went unanswered
        # (as with fixed timeouts: rpc_timeout_s after the second try before, ~2.1 s)
        waited = net.clock.now() - start
        assert waited == pytest.approx(2 * FAST.rpc_timeout_s)
        assert net.nodes[live[5]].node_id not in me.routing and me.steps.get(
            net.nodes[live[5]].node_id) is None


class TestCall:
    def test_a_call_reaches_the_handler_and_the_reply_comes_back(self) -> None:
        net = SimNetwork(FAST, seed=54, wire=True)
        live = net.grow(10)
        seen: list[tuple[str, Call]] = []

        def double(sender: Contact, call: Call, now: float,  # type: ignore[no-untyped-def]
                   eff: Effects):
            seen.append((sender.address, call))
            return 7, (call.args[0] * 2, "ok"), call.value.to_value() * 2  # type: ignore

        net.nodes[live[3]].on_call = double
        done = net.run_op(live[0], lambda node, now: node.call(
            net.contact(live[3]), 5, key_id("w"), now, args=(21,), value=np.arange(3.0)))
        assert [a for a, _ in seen] == [live[0]] and seen[0][1].method == 5
        assert done.reply is not None and done.reply.status == 7
        assert done.reply.args == (42, "ok")
        assert done.reply.value.to_value().tolist() == [0.0, 2.0, 4.0]  # type: ignore

    def test_no_handler_and_dead_peers(self) -> None:
        net = SimNetwork(FAST, seed=55)
        live = net.grow(10)
        done = net.run_op(live[0], lambda node, now: node.call(
            net.contact(live[4]), 1, key_id("w"), now))
        assert done.reply is not None and done.reply.status == NO_HANDLER
        net.kill(live[4])
        done = net.run_op(live[0], lambda node, now: node.call(
            net.contact(live[4]), 1, key_id("w"), now))
        assert done.reply is None and done.contacts == () and done.rpcs == 2

    @staticmethod
    def _answered(max_failures: int, calls: int) -> int:
        net = SimNetwork(KademliaConfig(refresh_on_join=False, max_failures=max_failures),
                         seed=56)
        live = net.grow(10)
        net.loss = 0.3
        net.nodes[live[2]].on_call = lambda s, c, now, eff: (1, (), None)
        answered = 0
        for _ in range(calls):
            done = net.run_op(live[0], lambda node, now: node.call(
                net.contact(live[2]), 1, key_id("w"), now))
            answered += done.reply is not None
            net.run_for(300.0)      # let a peer evicted by two losses be heard of again
        return answered

    def test_a_lost_call_is_retried(self) -> None:
        # One try fails with chance 1 - 0.7^2 = 0.51, two in a row with 0.26: of 80 calls
        # ~59 are answered with a retry (sd 3.9) and ~39 without one (sd 4.5).
        assert self._answered(2, 80) >= 50 >= self._answered(1, 80)


class TestGossip:
    def test_replies_carry_the_freshest_steps_and_callers_take_them_as_lower_bounds(self) -> None:
        owner = KademliaNode(KadId(1), "owner", rng=random.Random(0))
        caller = KademliaNode(KadId(2), "caller", rng=random.Random(1))
        for i in range(3, 25):                  # 22 peers report to the owner, one by one
            owner.receive(f"p{i}", encode(Ping(1, KadId(i << 100), 50 + i)), now=float(i))
        owner.step = 3
        _, eff = caller.call(Contact(KadId(1), "owner"), 1, key_id("w"), now=30.0)
        reply = owner.receive("caller", eff.sends[0].message, now=30.1).sends[0].message
        assert len(reply.peer_steps) == caller.config.gossip_steps == 16
        assert {i >> 100 for i, _ in reply.peer_steps} == set(range(9, 25))   # the freshest
        caller.steps.observe(KadId(24 << 100), "p24", 99, now=29.0)      # knows better already
        caller.receive("owner", reply, now=30.2)
        heard = caller.steps.get(KadId(20 << 100))
        assert heard is not None and heard.step == 70 and heard.seen_at == float("-inf")
        assert caller.steps.get(KadId(24 << 100)).step == 99  # type: ignore[union-attr]
        owned = caller.steps.get(KadId(1))                       # the owner itself, first-hand
        assert owned is not None and owned.step == 3 and owned.seen_at == 30.2

    def test_gossip_can_be_turned_off(self) -> None:
        owner = KademliaNode(KadId(1), "owner", KademliaConfig(gossip_steps=0),
                             rng=random.Random(0))
        owner.receive("p", encode(Ping(1, KadId(7), 5)), now=0.0)
        call = Call(3, KadId(2), 1, key_id("w"))
        reply = owner.receive("caller", call, now=1.0).sends[0].message
        assert reply.peer_steps == ()


class TestWatchers:
    def test_a_peer_asking_while_ahead_is_told_once(self) -> None:
        node = KademliaNode(KadId(1), "me", rng=random.Random(0))
        node.step = 4
        node.receive("ahead", encode(Ping(1, KadId(7), 9)), now=1.0)    # waits on us, likely
        node.receive("behind", encode(Ping(2, KadId(8), 2)), now=1.0)   # does not
        assert [c.address for c in node.take_watchers()] == ["ahead"]
        assert node.take_watchers() == []

    def test_a_step_is_one_way_and_raises_the_known_step(self) -> None:
        me = KademliaNode(KadId(1), "me", rng=random.Random(0))
        ahead = KademliaNode(KadId(7), "ahead", rng=random.Random(1))
        me.step, ahead.step = 4, 9
        me.receive("ahead", ahead.ping(Contact(KadId(1), "me"), now=1.0)[1].sends[0].message,
                   now=1.0)
        [watcher] = me.take_watchers()
        me.step = 5
        told = me.tell_step(watcher)
        assert told.address == "ahead" and decode(encode(told.message)) == told.message
        advances = ahead.steps.advances
        eff = ahead.receive("me", encode(told.message), now=2.0)
        assert eff.sends == [] and eff.timers == []                  # no answer, no timer
        heard = ahead.steps.get(KadId(1))
        assert heard is not None and heard.step == 5 and heard.seen_at == 2.0
        assert ahead.steps.advances > advances                       # a blocked check re-runs

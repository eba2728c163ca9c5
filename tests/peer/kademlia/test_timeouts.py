"""Adaptive RPC timeouts (``rtt.py``): they follow measured round trips, a dead contact is
given up after about that long instead of ``rpc_timeout_s``, and a live contact that is only
slow keeps its place (its late answers count)."""
from __future__ import annotations

from typing import Any

import pytest

from engines.peer.kademlia.events import Effects, KademliaConfig
from engines.peer.kademlia.ids import KadId
from engines.peer.kademlia.node import KademliaNode
from engines.peer.kademlia.rtt import RttEstimator
from engines.peer.kademlia.sim import SimNetwork

# one-way latency 10-12 ms: round trips of 20-24 ms, timeouts of 50-75 ms
STEADY = (0.010, 0.012)
CONFIG = KademliaConfig(refresh_on_join=False, refresh_interval_s=1e9,
                        republish_interval_s=1e9)


class TestEstimator:
    def test_the_timeout_follows_the_round_trips_within_its_bounds(self) -> None:
        est = RttEstimator(low=0.05, high=2.0)
        assert est.timeout(1) == 2.0                  # nothing measured: the fixed timeout
        for _ in range(50):
            est.observe(1, 0.2)
        assert est.timeout(1) == pytest.approx(0.2, rel=0.05)   # steady: srtt, no variance
        for _ in range(50):
            est.observe(2, 0.001)
        assert est.timeout(2) == 0.05                  # the floor
        for rtt in [0.5, 3.0] * 10:
            est.observe(3, rtt)
        assert est.timeout(3) == 2.0                   # the ceiling
        # a contact never measured gets the estimate pooled over every reply
        pooled = RttEstimator(low=0.05, high=2.0)
        for node_id in range(10):
            pooled.observe(node_id, 0.1)
        assert 0.1 < pooled.timeout(99) < 0.2

    def test_a_timeout_doubles_the_next_until_a_reply(self) -> None:
        est = RttEstimator(low=0.05, high=2.0)
        for _ in range(20):
            est.observe(1, 0.1)
        base = est.timeout(1)
        est.backoff(1)
        assert est.timeout(1) == pytest.approx(2 * base)
        est.backoff(1)
        assert est.timeout(1) == pytest.approx(4 * base)
        for _ in range(5):
            est.backoff(1)
        assert est.timeout(1) == 2.0                   # never past the ceiling
        est.observe(1, 0.1)
        assert est.timeout(1) == pytest.approx(base, rel=0.2)

    def test_estimates_are_bounded_and_forgotten(self) -> None:
        est = RttEstimator(low=0.05, high=2.0, max_contacts=3)
        for node_id in range(5):
            est.observe(node_id, 0.5)
        assert est.srtt(0) is None and est.srtt(4) == 0.5
        est.forget(4)
        assert est.srtt(4) is None


class TestLookupRevive:
    def test_a_contact_given_up_on_that_answers_late_counts_in_a_running_lookup(self) -> None:
        from engines.peer.kademlia.lookup import Lookup
        from engines.peer.kademlia.routing import Contact
        a, b, c = Contact(KadId(1), "a"), Contact(KadId(2), "b"), Contact(KadId(8), "c")
        lk = Lookup(KadId(0), [a, b, c], ksize=3, alpha=3)
        assert len(lk.next_queries()) == 3
        lk.on_failure(KadId(1))
        lk.on_nodes(KadId(2), [])
        assert not lk.revive(KadId(2))               # answered: nothing to revive
        assert lk.revive(KadId(1)) and lk.is_pending(KadId(1))
        lk.on_nodes(KadId(1), [])
        lk.on_nodes(KadId(8), [])
        assert lk.is_done and [x.address for x in lk.result()] == ["a", "b", "c"]


class Stalled:
    """A live node whose process stalls: everything it sends goes out ``stall_s`` late."""

    def __init__(self, net: SimNetwork, address: str, stall_s: float) -> None:
        self.net, self.address, self.stall_s = net, address, stall_s
        self.node = net.nodes[address]

    def _later(self, effects: Effects) -> Effects:
        self.net.clock.call_later(self.stall_s, lambda: self.net.apply(self.address, effects))
        return Effects()

    def receive(self, sender: str, message: Any, now: float, frames: Any = ()) -> Effects:
        return self._later(self.node.receive(sender, message, now, frames))

    def on_timer(self, kind: Any, token: int, now: float) -> Effects:
        return self.node.on_timer(kind, token, now)


def steady_net(n: int, seed: int) -> SimNetwork:
    net = SimNetwork(CONFIG, seed=seed, latency_s=STEADY)
    net.grow(n)
    return net


def target_next_to(net: SimNetwork, address: str) -> KadId:
    return KadId(net.nodes[address].node_id ^ 1)



def _stalled(seed: int, slow: str, stall_s: float) -> tuple[Any, Any, Any, Any]:
    """A steady 60-node net where n0 has measured ``slow`` (its timeout for it is under
    0.1 s), then ``slow`` stalls ``stall_s`` on every request: (net, n0's node, slow's id,
    a target next to slow)."""
    net = steady_net(60, seed=seed)
    target = target_next_to(net, slow)
    net.find_node("n0", target)
    node, slow_id = net.nodes["n0"], net.nodes[slow].node_id
    assert node.rpc_timeout(slow_id) < 0.1
    net.attach(slow, Stalled(net, slow, stall_s))
    return net, node, slow_id, target


class TestAdaptiveTimeouts:
    def test_timeouts_adapt_to_the_measured_round_trips(self) -> None:
        net = steady_net(40, seed=71)
        node = net.nodes["n0"]
        peer = net.contact("n5")
        assert node.rpc_timeout(peer.node_id) <= 2.0
        net.run_op("n0", lambda n, now: n.ping(peer, now))
        # round trips of 20-24 ms: about 3x the first one (srtt + 4 x rttvar, rttvar =
        # srtt / 2 at first), not the 2 s of rpc_timeout_s
        assert CONFIG.min_rpc_timeout_s <= node.rpc_timeout(peer.node_id) < 0.1
        for _ in range(20):
            net.run_op("n0", lambda n, now: n.ping(peer, now))
        assert node.rpc_timeout(peer.node_id) == CONFIG.min_rpc_timeout_s   # the floor
        assert node.stats.timeouts == 0

    def test_a_dead_contact_is_given_up_after_the_adaptive_time(self) -> None:
        net = steady_net(60, seed=72)
        asker, victim = "n0", "n17"
        target = target_next_to(net, victim)
        net.find_node(asker, target)                     # measures the peers near it
        node = net.nodes[asker]
        assert net.nodes[victim].node_id in node.routing
        net.kill(victim)
        start = net.clock.now()
        done = net.run_op(asker, lambda n, now: n.find_node(target, now))
        # two tries, ~70 ms then ~140 ms: well under one rpc_timeout_s (2 s; 4 s before)
        assert done.elapsed_s < 0.5 and net.clock.now() - start < 0.5
        assert net.contact(victim) not in done.contacts
        assert [c.node_id for c in done.contacts] == [
            c.node_id for c in net.true_closest(target, CONFIG.ksize)]
        # the eviction waits until two rpc_timeout_s passed since the first try, unanswered
        assert net.nodes[victim].node_id in node.routing
        net.run_for(2 * CONFIG.rpc_timeout_s - (net.clock.now() - start) - 0.01)
        assert net.nodes[victim].node_id in node.routing
        net.run_for(0.02)
        assert net.nodes[victim].node_id not in node.routing and node.is_gone(
            net.nodes[victim].node_id, net.clock.now())

    def test_a_slow_live_contact_keeps_its_place_and_its_late_answers_count(self) -> None:
        net, node, slow_id, target = _stalled(73, "n23", 0.3)   # stalls 0.3 s: 6x its timeout
        asker = "n0"
        net.run_op(asker, lambda n, now: n.find_node(target, now))
        # timed out twice (~70 then ~140 ms): this lookup went on without it, but its
        # answers, late, are taken (not refused as unsolicited) and keep it in the table
        assert node.stats.timeouts == 2
        net.run_for(CONFIG.rpc_timeout_s)             # past every deadline: still there
        assert node.stats.late_replies == 2 and net.rejected == 0
        assert slow_id in node.routing and not node.is_gone(slow_id, net.clock.now())
        # its timeout now covers its round trip: the next lookup waits for it, no miss
        assert node.rpc_timeout(slow_id) > 0.3
        timeouts = node.stats.timeouts
        done = net.run_op(asker, lambda n, now: n.find_node(target, now))
        assert done.contacts[0].node_id == slow_id and node.stats.timeouts == timeouts

    def test_a_live_contact_silent_for_less_than_two_full_timeouts_keeps_its_place(self):
        """As with fixed timeouts, where a contact was evicted after two missed tries of
        ``rpc_timeout_s`` each: stalled 3 s (rpc_timeout_s 2 s), it was evicted after one
        adaptive timeout (~70 ms) plus rpc_timeout_s, 2.07 s, and its answers refused."""
        net, node, slow_id, target = _stalled(77, "n23", 3.0)
        net.run_op("n0", lambda n, now: n.find_node(target, now))
        assert node.stats.timeouts == 2                  # the lookup went on without it
        net.run_for(2 * CONFIG.rpc_timeout_s)            # past every deadline
        assert slow_id in node.routing and not node.is_gone(slow_id, net.clock.now())
        assert node.stats.late_replies >= 1

    def test_a_late_answer_feeds_the_lookup_still_waiting_on_the_retry(self) -> None:
        net, node, slow_id, target = _stalled(75, "n31", 0.1)   # past its first timeout only
        asker = "n0"
        done = net.run_op(asker, lambda n, now: n.find_node(target, now))
        assert node.stats.timeouts == 1 and node.stats.late_replies >= 1
        assert done.contacts[0].node_id == slow_id and slow_id in node.routing
        assert [c.node_id for c in done.contacts] == [
            c.node_id for c in net.true_closest(target, CONFIG.ksize)]
        net.run_for(CONFIG.rpc_timeout_s)   # the retry's own answer is dropped quietly
        assert net.rejected == 0 and node.stats.late_replies == 2

    def test_a_ping_to_a_slow_peer_ends_with_its_late_answer(self) -> None:
        net = steady_net(30, seed=74)
        net.run_op("n0", lambda n, now: n.ping(net.contact("n9"), now))
        net.attach("n9", Stalled(net, "n9", 0.5))
        done = net.run_op("n0", lambda n, now: n.ping(net.contact("n9"), now))
        assert done.contacts == (net.contact("n9"),)   # answered, if late
        node = net.nodes["n0"]
        assert node.stats.timeouts >= 1 and node.stats.late_replies >= 1

    def test_a_ping_given_up_on_ends_when_the_peer_leaves(self) -> None:
        net = steady_net(30, seed=76)
        net.run_op("n0", lambda n, now: n.ping(net.contact("n9"), now))
        net.attach("n9", Stalled(net, "n9", 1.5))
        start = net.clock.now()
        op_id, eff = net.nodes["n0"].ping(net.contact("n9"), start)
        net.apply("n0", eff)
        net.run_for(0.5)                   # two misses: waits for its answer or eviction
        assert net.nodes["n0"].stats.timeouts == 2 and ("n0", op_id) not in net.results
        net.leave("n9")                    # its LEAVE ends the PING at once
        assert net.results[("n0", op_id)].contacts == ()
        assert net.clock.now() - start < 1.0

    def test_fixed_timeouts_when_the_floor_is_the_ceiling(self) -> None:
        config = KademliaConfig(refresh_on_join=False, min_rpc_timeout_s=2.0)
        node = KademliaNode(KadId(1), "a", config)
        node._rtt.observe(2, 0.001)                    # noqa: SLF001 (a measured contact)
        assert node.rpc_timeout(2) == 2.0


class TestAlone:
    """``KademliaNode.alone``: whether a node knows no other peer, those evicted lately
    included (the P2P engine holds a write nobody else took until then)."""

    def test_a_node_evicted_for_good_leaves_its_peer_alone_a_while_later(self) -> None:
        net = steady_net(2, seed=5)
        node, other = net.nodes["n0"], net.contact("n1")
        assert not node.alone(net.clock.now())
        net.kill("n1")
        net.run_op("n0", lambda n, now: n.ping(other, now))
        for _ in range(1000):                   # virtual time, 10 ms at a time
            if node.is_gone(other.node_id, net.clock.now()):
                break
            net.run_for(0.01)
        evicted = net.clock.now()
        assert other.node_id not in node.routing and node.is_gone(other.node_id, evicted)
        assert not node.alone(evicted)          # it may come back (late answers, evicted)
        lately = 10 * CONFIG.rpc_timeout_s      # after its eviction (no value moved with it)
        net.run_for(lately - 0.05)
        assert not node.alone(net.clock.now())
        net.run_for(0.06)
        assert node.alone(net.clock.now())

    def test_a_node_that_left_leaves_its_peer_alone_at_once(self) -> None:
        net = steady_net(2, seed=5)
        net.leave("n1")
        assert net.nodes["n0"].alone(net.clock.now())

    def test_a_node_that_never_knew_another_is_alone(self) -> None:
        assert KademliaNode(KadId(1), "a", CONFIG).alone(0.0)


@pytest.mark.parametrize("low", [0.0, -0.1, float("nan")])
def test_a_timeout_floor_of_zero_or_less_is_refused(low: float) -> None:
    # 0 or less made every PING and FIND_NODE time out at once
    with pytest.raises(ValueError, match="min_rpc_timeout_s"):
        KademliaConfig(rpc_timeout_s=2.0, min_rpc_timeout_s=low)

"""STORE / FIND_VALUE on simulated overlays: replication, failures, republish, hand-off, TTL."""
from __future__ import annotations

import random

from engines.peer.kademlia.events import KademliaConfig
from engines.peer.kademlia.ids import KadId, key_id
from engines.peer.kademlia.sim import SimNetwork
from engines.peer.kademlia.storage import MemoryStorage

QUIET = dict(refresh_on_join=False, refresh_interval_s=1e9)   # isolate republish from refresh


def holders(net: SimNetwork, key: KadId) -> set[str]:
    now = net.clock.now()
    return {a for a in net.alive if net.nodes[a].storage.get(key, now) is not None}


class TestStoreAndFind:
    def test_a_stored_value_is_found_from_every_node(self, net200: SimNetwork) -> None:
        live = sorted(net200.alive)
        key = key_id("model/w")
        done = net200.set(live[17], key, b"weights-v1")
        truth = {c.address for c in net200.true_closest(key, 20)}
        assert {c.address for c in done.stored_on} == truth   # the k closest, self included
        for address in live:
            assert net200.get(address, key).value == b"weights-v1"

    def test_missing_key_is_not_found(self, net200: SimNetwork) -> None:
        done = net200.get(sorted(net200.alive)[3], key_id("never stored"))
        assert done.value is None and len(done.contacts) == 20

    def test_replication_factor_is_configurable(self) -> None:
        net = SimNetwork(KademliaConfig(replication=5, **QUIET), seed=4)
        live = net.grow(60)
        key = key_id("b")
        net.set(live[0], key, b"x")
        expected = {c.address for c in net.true_closest(key, 5)} | {live[0]}  # origin keeps one
        assert holders(net, key) == expected

    def test_skipped_holders_get_no_store_and_no_stand_in(self) -> None:
        net = SimNetwork(KademliaConfig(replication=5, **QUIET), seed=4)
        live = net.grow(60)
        key = key_id("b")
        closest = [c.address for c in net.true_closest(key, 5)]
        writer = next(a for a in live if a not in closest)     # it keeps a copy of its own
        skipped = {net.contact(a).node_id for a in closest[:2]}
        done = net.run_op(writer, lambda node, now: node.set(key, b"x", now, skip=skipped))
        # the two skipped holders are still counted as holders: no farther peer stands in
        assert holders(net, key) == set(closest[2:]) | {writer}
        assert done.asked == 3 and done.durable
        assert {c.address for c in done.stored_on} == set(closest[2:])


    def test_a_refused_write_is_not_durable_even_at_the_clock_it_asked(self) -> None:
        # before: the holders, refusing, answered the (clock, writer) they held, which an
        # owner that dropped a branch and wrote its clocks again made equal to the refused
        # write's; at a clock <= its base that counted as held, and the round as durable
        net = SimNetwork(KademliaConfig(replication=3, **QUIET), seed=4)
        net.grow(20)
        key = key_id("k")
        writer, *others = [c.address for c in net.true_closest(key, 3)]
        me = net.contact(writer).node_id
        for address in others:
            node = net.nodes[address]
            node.storage.put(key, b"another branch", net.clock.now(), 3600.0, clock=2,
                             writer=me)
            node.accept_store = lambda sender, store, now, eff: False   # the fence says no
        done = net.run_op(writer, lambda node, now: node.set(key, b"old", now, clock=2,
                                                             base=2))
        assert not done.durable and done.refused == 2


class TestFailuresAndRepublish:
    def test_keys_survive_25_percent_failures_and_a_republish_round(self) -> None:
        config = KademliaConfig(**QUIET)
        net = SimNetwork(config, seed=25)
        live = net.grow(200)
        rng = random.Random(26)
        keys = {key_id(f"k{i}"): f"v{i}".encode() for i in range(20)}
        for key, value in keys.items():
            net.set(rng.choice(live), key, value)
        net.kill_fraction(0.25, rng)
        assert len(net.alive) == 150
        survivors = sorted(net.alive)
        for key, value in keys.items():
            assert net.get(rng.choice(survivors), key).value == value
        net.run_for(config.republish_interval_s + 60)      # one republish round everywhere
        for key, value in keys.items():
            for _ in range(5):
                assert net.get(rng.choice(survivors), key).value == value
        # Holders skip a key STOREd within the interval (paper 2.5), so when the origin died,
        # the holders' own republish comes one round later; then replication is back to k.
        net.run_for(config.republish_interval_s)
        for key in keys:
            truth = {c.address for c in net.true_closest(key, config.ksize)}
            assert len(holders(net, key) & truth) >= config.ksize - 1

    def test_a_closer_newcomer_receives_the_key_at_the_next_republish(self) -> None:
        config = KademliaConfig(**QUIET)
        net = SimNetwork(config, seed=7)
        live = net.grow(60)
        key = key_id("handoff")
        net.set(live[5], key, b"payload")
        newcomer = net.add_node(KadId(key ^ 1))             # closer to the key than anyone
        net.join(newcomer, live[0])
        assert net.nodes[newcomer].storage.get(key, net.clock.now()) is None
        net.run_for(config.republish_interval_s + 60)
        assert net.nodes[newcomer].storage.get(key, net.clock.now()).value.to_value() == b"payload"


class TestExpiry:
    def test_values_expire_after_ttl_unless_the_origin_republishes(self) -> None:
        config = KademliaConfig(ttl_s=100.0, republish_interval_s=30.0, **QUIET)
        net = SimNetwork(config, seed=9)
        live = net.grow(40)
        kept, dropped = key_id("kept"), key_id("dropped")
        net.set(live[1], kept, b"k")
        net.set(live[2], dropped, b"d")
        net.kill(live[2])                                   # dropped's origin is gone
        net.run_for(60.0)
        assert holders(net, dropped) and holders(net, kept)
        net.run_for(60.0)                                   # t ~ 120 > ttl
        assert holders(net, dropped) == set()
        assert net.get(live[3], dropped).value is None
        net.run_for(300.0)                                  # the origin renews "kept"
        assert len(holders(net, kept)) >= 20
        assert net.get(live[3], kept).value == b"k"

    def test_storage_ttl_and_republish_bookkeeping(self) -> None:
        store = MemoryStorage()
        store.put(KadId(1), b"a", now=0.0, ttl_s=50.0)
        store.put(KadId(2), b"b", now=0.0, ttl_s=50.0, is_origin=True)
        origin = store.record(KadId(2))
        assert store.due_for_republish(10.0, interval_s=30.0) == [(KadId(2), origin)]
        assert [k for k, _ in store.due_for_republish(30.0, interval_s=30.0)] == [1, 2]
        store.put(KadId(1), b"a", now=35.0, ttl_s=10.0)     # a shorter re-STORE keeps the expiry
        assert store.record(KadId(1)).expires_at == 50.0
        assert store.expire(50.0) == [1, 2] and len(store) == 0

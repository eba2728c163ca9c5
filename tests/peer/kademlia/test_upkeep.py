"""Keys outlive their holders: re-replication after replication - 1 holders die, hand-off when
holders leave gracefully (LEAVE makes every contact drop the leaver at once)."""
from __future__ import annotations

import random
from typing import Any, Callable, Sequence

import numpy as np

from engines.peer.kademlia.events import Effects, KademliaConfig
from engines.peer.kademlia.ids import KadId, key_id
from engines.peer.kademlia.messages import Store
from engines.peer.kademlia.sim import SimNetwork

CHECKED = KademliaConfig(replication=3, replica_check_s=5.0, refresh_on_join=False,
                         refresh_interval_s=1e9, republish_interval_s=1e9)


def holders(net: SimNetwork, key: KadId) -> dict[str, int]:
    """Live address -> clock of the copy it holds."""
    now = net.clock.now()
    found = {a: net.nodes[a].storage.get(key, now) for a in net.alive}
    return {a: r.clock for a, r in found.items() if r is not None}


def replicated(net: SimNetwork, key: KadId, clock: int) -> bool:
    """Whether the 3 closest live peers all hold version ``clock`` of ``key``."""
    held = holders(net, key)
    return all(held.get(c.address) == clock for c in net.true_closest(key, 3))


def until(net: SimNetwork, done: Callable[[], bool], max_s: float) -> float:
    """Advance virtual time in 0.5 s steps until ``done()``; returns the time it took."""
    start = net.clock.now()
    while not done():
        assert net.clock.now() - start < max_s, "not done in time"
        net.run_for(0.5)
    return net.clock.now() - start


class DiesOnStore:
    """A simulated peer that dies the moment a STORE of ``key`` reaches it (unanswered)."""

    def __init__(self, net: SimNetwork, address: str, key: KadId) -> None:
        self.net, self.address, self.key = net, address, key
        self.node = net.nodes[address]

    def receive(self, sender_address: str, message: object, now: float,
                frames: Sequence[object] = ()) -> Effects:
        if isinstance(message, Store) and message.key == self.key:
            self.net.kill(self.address)
            return Effects()
        return self.node.receive(sender_address, message, now, frames)

    def on_timer(self, kind: Any, token: int, now: float) -> Effects:
        return self.node.on_timer(kind, token, now)


class TestReReplication:
    def test_keys_survive_the_loss_of_two_of_three_holders_and_are_replicated_again(self) -> None:
        net = SimNetwork(CHECKED, seed=31)
        live = net.grow(60)
        rng = random.Random(32)
        keys = {key_id(f"w{i}"): np.full(4, float(i)) for i in range(6)}
        for key, value in keys.items():
            writer = rng.choice(live)
            net.set(writer, key, value)
            net.set(writer, key, value + 1)                    # clock 1 everywhere
        victims: set[str] = set()
        for key in keys:
            victims |= {c.address for c in net.true_closest(key, 3)[:2]}
        for key in keys:       # every key keeps one live holder (the seed was chosen for it)
            assert {c.address for c in net.true_closest(key, 3)} - victims
        for address in victims:
            net.kill(address)
        assert all(not replicated(net, key, 1) for key in keys)
        # A replica check notices (two missed PINGs: 4 s) and the surviving holder stores
        # again; its lookup meets other victims (4 s each), so allow a few rounds of that.
        waited = until(net, lambda: all(replicated(net, key, 1) for key in keys), 40.0)
        assert waited <= CHECKED.replica_check_s + 6 * 2 * CHECKED.rpc_timeout_s
        for key, value in keys.items():
            for address in sorted(net.alive)[::7]:
                got = net.get(address, key)
                assert got.clock == 1 and got.value.tolist() == (value + 1).tolist()
        assert sum(net.nodes[a].stats.replicated for a in net.alive) >= len(keys)

    def test_new_holders_that_die_while_they_are_being_stored_on_are_replaced(self) -> None:
        net = SimNetwork(CHECKED, seed=34)
        net.grow(40)
        key = key_id("k")
        first, second, third = net.true_closest(key, 3)
        net.set(first.address, key, b"v")          # the writer is a holder: no extra copy
        net.kill(second.address)
        net.kill(third.address)
        # ``first`` alone stores the key again, on the next two: both die unanswered
        chosen = net.true_closest(key, 3)[1:]
        for contact in chosen:
            net.attach(contact.address, DiesOnStore(net, contact.address, key))
        until(net, lambda: not {c.address for c in chosen} & net.alive, 20.0)
        assert set(holders(net, key)) == {first.address}
        # their STOREs time out and they are evicted while that REPLICATE still runs: one
        # more must follow, or the key stays on 1 live peer until the next republish
        until(net, lambda: replicated(net, key, 0), 20.0)
        assert net.nodes[first.address].stats.replicated == 2

    def test_a_failed_request_also_triggers_it_without_replica_checks(self) -> None:
        config = KademliaConfig(replication=3, refresh_on_join=False, refresh_interval_s=1e9,
                                republish_interval_s=1e9)
        net = SimNetwork(config, seed=33)
        live = net.grow(40)
        key = key_id("k")
        net.set(live[3], key, b"v")
        first, second, third = net.true_closest(key, 3)
        net.kill(first.address)
        # the second holder learns of the death when its own request to it times out twice
        net.run_op(second.address, lambda node, now: node.ping(first, now))
        net.run_for(config.rpc_timeout_s)   # the eviction waits out rpc_timeout_s
        assert first.node_id not in net.nodes[second.address].routing
        until(net, lambda: replicated(net, key, 0), 20.0)
        assert third.address in holders(net, key)


class TestGracefulLeave:
    def test_a_leaving_holder_hands_its_keys_to_the_next_closest(self) -> None:
        net = SimNetwork(CHECKED, seed=41)
        live = net.grow(50)
        key = key_id("model")
        net.set(live[9], key, np.arange(5.0))
        net.set(live[9], key, np.arange(5.0) * 2)             # clock 1
        leaver = net.true_closest(key, 1)[0]
        knew_it = [a for a in net.alive if leaver.node_id in net.nodes[a].routing]
        done = net.leave(leaver.address)
        assert done.stored_on and leaver.address not in net.alive
        assert replicated(net, key, 1)                        # at once: no timeout waited for
        assert net.nodes[leaver.address].storage.keys() == []
        # its contacts dropped it on LEAVE, without any RPC timing out
        assert knew_it and all(leaver.node_id not in net.nodes[a].routing for a in knew_it)
        # (an adaptive timeout may fire on a slow answer elsewhere: each one came late)
        assert all(net.nodes[a].stats.timeouts <= net.nodes[a].stats.late_replies
                   for a in knew_it)
        assert net.get(live[30], key).value.tolist() == (np.arange(5.0) * 2).tolist()

    def test_every_original_holder_can_leave_one_after_another(self) -> None:
        net = SimNetwork(CHECKED, seed=42)
        live = net.grow(40)
        key = key_id("k")
        net.set(live[0], key, b"kept")
        original = [c.address for c in net.true_closest(key, 3)]
        for address in original + [live[0]]:
            if address in net.alive:
                net.leave(address)
        assert replicated(net, key, 0)
        assert not set(original) & set(holders(net, key))
        assert all(net.get(a, key).value == b"kept" for a in sorted(net.alive)[::6])

    def test_leave_from_a_stranger_changes_nothing(self) -> None:
        net = SimNetwork(CHECKED, seed=43)
        live = net.grow(10)
        node = net.nodes[live[0]]
        before = sorted(c.address for c in node.routing.contacts())
        from engines.peer.kademlia.rpc import Leave, encode
        eff = node.receive("stranger", encode(Leave(0, KadId(12345))), now=net.clock.now())
        assert eff.sends == [] and sorted(c.address for c in node.routing.contacts()) == before
        assert not node._is_dead(12345, net.clock.now())

"""k-bucket invariants, closest() against brute force, LRS eviction only after a failed PING."""
from __future__ import annotations

import heapq
import random

import pytest

from actorpy.errors import ProtocolError
from engines.peer.kademlia.events import KademliaConfig, TimerKind
from engines.peer.kademlia.ids import ID_SPACE, KadId, random_id
from engines.peer.kademlia.node import KademliaNode
from engines.peer.kademlia.routing import Contact, RoutingTable
from engines.peer.kademlia.rpc import FindNode, Ping, Pong


def table_after_joins(n: int, seed: int, ksize: int = 20) -> tuple[RoutingTable, list[Contact]]:
    rng = random.Random(seed)
    table = RoutingTable(random_id(rng), ksize=ksize)
    seen = [Contact(random_id(rng), f"n{i}") for i in range(n)]
    for contact in seen:
        table.observe(contact, now=0.0)
    return table, seen


class TestBucketInvariants:
    @pytest.mark.parametrize("seed", [1, 2])
    def test_after_1000_joins(self, seed: int) -> None:
        table, _ = table_after_joins(1000, seed)
        buckets = table.buckets
        assert buckets[0].lo == 0 and buckets[-1].hi == ID_SPACE
        for left, right in zip(buckets, buckets[1:]):
            assert left.hi == right.lo                     # contiguous: a partition
        held = 0
        for bucket in buckets:
            assert len(bucket.contacts) <= table.ksize
            assert all(bucket.lo <= i < bucket.hi for i in bucket.contacts)
            assert all(bucket.lo <= i < bucket.hi for i in bucket.replacements)
            held += len(bucket.contacts)
        assert held == len(table) > 5 * table.ksize
        # only the bucket holding our own id ever split: one per depth
        assert sorted(b.depth() for b in buckets if not b.covers(table.own_id)) == \
            list(range(1, len(buckets)))

    def test_closest_equals_brute_force(self) -> None:
        table, _ = table_after_joins(1000, seed=3)
        rng = random.Random(4)
        held = table.contacts()
        for n in (1, 3, 20, 500):
            for _ in range(50):
                target = random_id(rng)
                truth = heapq.nsmallest(n, held, key=lambda c: c.node_id ^ target)
                assert table.closest(target, n) == truth

    def test_closest_is_never_empty_while_the_table_is_not(self) -> None:
        table = RoutingTable(KadId(0), ksize=20)
        table.observe(Contact(KadId(ID_SPACE - 1), "far"), now=0.0)
        assert [c.address for c in table.closest(KadId(0), 20)] == ["far"]

    def test_contacts_claiming_our_id_or_anothers_are_refused(self) -> None:
        table = RoutingTable(KadId(5), ksize=4)
        table.observe(Contact(KadId(9), "a"), now=0.0)
        with pytest.raises(ProtocolError):
            table.observe(Contact(KadId(5), "me?"), now=0.0)
        with pytest.raises(ProtocolError):
            table.observe(Contact(KadId(9), "impostor"), now=0.0)
        assert table.contacts() == [Contact(KadId(9), "a")]


def far_contacts(count: int) -> list[Contact]:
    # all in the top half of the space: one bucket that never splits for own id 0
    return [Contact(KadId((1 << 159) + i), f"far{i}") for i in range(count)]


class TestLeastRecentlySeenEviction:
    def test_table_asks_for_a_ping_and_keeps_the_oldest_until_it_fails(self) -> None:
        table = RoutingTable(KadId(0), ksize=3)
        old, mid, new, newer = far_contacts(4)[0:1] + far_contacts(4)[1:2] + far_contacts(4)[2:]
        for c in (old, mid, new):
            assert table.observe(c, now=1.0) is None
        assert table.observe(newer, now=2.0) == old        # "ping this one"
        assert old in table.contacts() and newer not in table.contacts()
        assert table.observe(old, now=3.0) is None          # it answered: now most recent
        assert table.observe(newer, now=4.0) == mid         # so the next oldest is asked for
        assert table.remove(mid.node_id) == newer           # mid failed: newer promoted
        assert set(table.contacts()) == {old, new, newer}

    def _full_node(self, max_failures: int = 2) -> tuple[KademliaNode, list[Contact]]:
        node = KademliaNode(KadId(0), "me", KademliaConfig(ksize=3, max_failures=max_failures),
                            rng=random.Random(0))
        contacts = far_contacts(4)
        for c in contacts[:3]:
            node.receive(c.address, Ping(1, c.node_id), now=0.0)
        return node, contacts

    def test_node_pings_the_oldest_and_keeps_it_when_it_answers(self) -> None:
        node, contacts = self._full_node()
        eff = node.receive(contacts[3].address, Ping(2, contacts[3].node_id), now=1.0)
        pings = [s for s in eff.sends if isinstance(s.message, Ping)]
        assert [s.address for s in pings] == ["far0"]
        assert contacts[0] in node.routing.contacts()       # not evicted before the PING fails
        node.receive("far0", Pong(pings[0].message.rpc_id, contacts[0].node_id), now=1.1)
        timer = [t for t in eff.timers if t.kind == TimerKind.RPC_TIMEOUT][0]
        node.on_timer(timer.kind, timer.token, now=3.0)     # late timer: already answered
        assert set(node.routing.contacts()) == set(contacts[:3])

    def test_node_evicts_the_oldest_only_after_its_pings_time_out(self) -> None:
        node, contacts = self._full_node()
        eff = node.receive(contacts[3].address, Ping(2, contacts[3].node_id), now=1.0)
        assert contacts[0] in node.routing.contacts()
        timer = [t for t in eff.timers if t.kind == TimerKind.RPC_TIMEOUT][0]
        retry = node.on_timer(timer.kind, timer.token, now=1.0 + timer.delay_s)
        # one lost PING is not enough: it is asked again, and not handed out meanwhile
        assert [(s.address, type(s.message)) for s in retry.sends] == [("far0", Ping)]
        assert contacts[0] in node.routing.contacts()
        eff = node.receive("far3", FindNode(3, contacts[3].node_id, KadId(0)), now=3.5)
        nodes = [s.message for s in eff.sends if s.address == "far3"]
        assert contacts[0] not in nodes[0].contacts
        node.on_timer(TimerKind.RPC_TIMEOUT, retry.timers[0].token, now=5.5)
        assert set(node.routing.contacts()) == {contacts[1], contacts[2], contacts[3]}

    def test_a_retried_ping_that_is_answered_keeps_the_contact(self) -> None:
        node, contacts = self._full_node()
        eff = node.receive(contacts[3].address, Ping(2, contacts[3].node_id), now=1.0)
        retry = node.on_timer(TimerKind.RPC_TIMEOUT, eff.timers[0].token, now=3.0)
        node.receive("far0", Pong(retry.sends[0].message.rpc_id, contacts[0].node_id), now=3.1)
        node.on_timer(TimerKind.RPC_TIMEOUT, retry.timers[0].token, now=5.0)   # answered: no-op
        assert set(node.routing.contacts()) == set(contacts[:3])
        eff = node.receive("far3", FindNode(3, contacts[3].node_id, KadId(0)), now=5.5)
        nodes = [s.message for s in eff.sends if s.address == "far3"]
        assert contacts[0] in nodes[0].contacts                 # trusted again

    def test_max_failures_one_evicts_at_the_first_miss(self) -> None:
        node, contacts = self._full_node(max_failures=1)
        eff = node.receive(contacts[3].address, Ping(2, contacts[3].node_id), now=1.0)
        retry = node.on_timer(TimerKind.RPC_TIMEOUT, eff.timers[0].token, now=3.0)
        assert retry.sends == []
        assert set(node.routing.contacts()) == {contacts[1], contacts[2], contacts[3]}

"""The codec round-trips every message; malformed or lying messages are rejected with
ProtocolError and leave the node's table untouched."""
from __future__ import annotations

import random

import pytest

from actorpy.errors import ProtocolError
from engines.peer.kademlia.events import KademliaConfig
from engines.peer.kademlia.ids import KadId, id_to_bytes
from engines.peer.kademlia.node import KademliaNode
from engines.peer.kademlia.routing import Contact
from engines.peer.kademlia.rpc import (PROTOCOL_VERSION, FindNode, FindValue, Kind, Nodes, Ping,
                                       Pong, Store, Stored, Value, decode, encode)

A, B = KadId(0xA << 150), KadId(0xB << 150)
MESSAGES = [
    Ping(1, A), Pong(2, A), Stored(3, A), FindNode(4, A, B), FindValue(5, A, B),
    Store(6, A, B, b"\x00" * 100, 60.0), Value(7, A, B, b"v"),
    Nodes(8, A, (Contact(B, "tcp://10.0.0.2:9"), Contact(KadId(1), "n1"))),
]


class TestCodec:
    @pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: m.KIND.name)
    def test_round_trip_through_plain_values(self, msg: object) -> None:
        wire = encode(msg)  # type: ignore[arg-type]
        assert wire[:2] == (PROTOCOL_VERSION, int(msg.KIND))  # type: ignore[attr-defined]
        assert all(isinstance(x, (int, float, bytes, str, list)) for x in wire)
        assert decode(wire) == msg
        assert decode(list(wire)) == msg

    def test_kinds_are_this_packages_own_enum(self) -> None:
        assert {m.KIND for m in MESSAGES} == set(Kind)

    @pytest.mark.parametrize("wire, reason", [
        ("ping", "tuple"),
        ((2, 1, 0, bytes(20)), "version"),
        ((1, 42, 0, bytes(20)), "unknown"),
        ((1, True, 0, bytes(20)), "unknown"),
        ((1, 1, -1, bytes(20)), "rpc_id"),
        ((1, 1, 1.5, bytes(20)), "rpc_id"),
        ((1, 1, True, bytes(20)), "rpc_id"),
        ((1, 1, 0, bytes(19)), "20 bytes"),
        ((1, 1, 0, "x" * 20), "bytes"),
        ((1, 1, 0, bytes(20), b"extra"), "fields"),
        ((1, 5, 0, bytes(20), bytes(21)), "20 bytes"),
        ((1, 3, 0, bytes(20), bytes(20), "text", 5.0), "bytes"),
        ((1, 3, 0, bytes(20), bytes(20), b"v", -1.0), "ttl"),
        ((1, 3, 0, bytes(20), bytes(20), b"v", float("inf")), "ttl"),
        ((1, 3, 0, bytes(20), bytes(20), b"v" * (2 << 20), 5.0), "limit"),
        ((1, 6, 0, bytes(20), [(bytes(20), "a")] * 2), "duplicate"),
        ((1, 6, 0, bytes(20), [(bytes(20 - 1), "a")]), "20 bytes"),
        ((1, 6, 0, bytes(20), [(bytes(20), "")]), "address"),
        ((1, 6, 0, bytes(20), [(bytes(20), 5)]), "address"),
        ((1, 6, 0, bytes(20), [bytes(20)]), "pair"),
        ((1, 6, 0, bytes(20), {"a": 1}), "list"),
    ])
    def test_malformed_messages_are_rejected(self, wire: object, reason: str) -> None:
        with pytest.raises(ProtocolError, match=reason):
            decode(wire)

    def test_huge_contact_lists_are_rejected(self) -> None:
        contacts = [(id_to_bytes(i + 1), f"n{i}") for i in range(10_000)]
        with pytest.raises(ProtocolError, match="limit"):
            decode((1, 6, 0, bytes(20), contacts))
        with pytest.raises(ProtocolError, match="limit"):
            decode((1, 6, 0, bytes(20), contacts[:21]), max_contacts=20)


class TestNodeRejects:
    def _node(self) -> tuple[KademliaNode, list[Contact]]:
        node = KademliaNode(KadId(1), "me", KademliaConfig(ksize=4), rng=random.Random(0))
        known = [Contact(A, "a"), Contact(B, "b")]
        for c in known:
            node.receive(c.address, encode(Ping(9, c.node_id)), now=0.0)
        return node, known

    def _snapshot(self, node: KademliaNode) -> list[tuple[int, list[Contact], list[Contact]]]:
        return [(b.lo, list(b.contacts.values()), list(b.replacements.values()))
                for b in node.routing.buckets]

    @pytest.mark.parametrize("sender, wire", [
        ("evil", encode(Ping(1, A))),                            # claims a's id
        ("a", encode(Ping(1, KadId(99)))),                       # a second id for a's address
        ("evil", encode(Ping(1, KadId(1)))),                     # claims our own id
        ("a", encode(Pong(77, A))),                              # unsolicited reply
        ("evil", (1, 5, 0, bytes(3), bytes(20))),                # short sender id
        ("evil", (1, 6, 0, bytes(20), [(bytes(20), "x")] * 5)),  # more than ksize contacts
        ("evil", (1, 7, 0, bytes(20), 12345)),                   # wrong type
    ])
    def test_table_untouched(self, sender: str, wire: tuple) -> None:
        node, _ = self._node()
        before = self._snapshot(node)
        with pytest.raises(ProtocolError):
            node.receive(sender, wire, now=1.0)
        assert self._snapshot(node) == before

    def test_one_address_cannot_fill_the_table_with_ids(self) -> None:
        node = KademliaNode(KadId(1), "me", KademliaConfig(ksize=20), rng=random.Random(0))
        rng = random.Random(5)
        rejected = 0
        for _ in range(200):
            try:
                node.receive("tcp://evil:1", encode(Ping(1, KadId(rng.getrandbits(160)))), 0.0)
            except ProtocolError:
                rejected += 1
        assert rejected == 199
        assert [c.address for c in node.routing.contacts()] == ["tcp://evil:1"]
        assert node.size_estimate() < 5

    def test_reply_under_another_id_is_rejected_and_the_rpc_stays_pending(self) -> None:
        node, known = self._node()
        _, eff = node.find_node(KadId(7), now=1.0)
        query = next(s for s in eff.sends if s.address == "a")
        before = self._snapshot(node)
        with pytest.raises(ProtocolError, match="claims the id of b"):
            node.receive("a", encode(Nodes(query.message.rpc_id, B, ())), now=1.1)
        assert self._snapshot(node) == before
        # the genuine reply is still accepted afterwards
        node.receive("a", encode(Nodes(query.message.rpc_id, A, ())), now=1.2)

    def test_reply_of_the_wrong_kind_is_rejected(self) -> None:
        node, _ = self._node()
        _, eff = node.find_node(KadId(7), now=1.0)
        query = next(s for s in eff.sends if s.address == "a")
        with pytest.raises(ProtocolError, match="does not answer"):
            node.receive("a", encode(Value(query.message.rpc_id, A, KadId(7), b"x")), now=1.1)


class TestNodeRejectsImpostorReplies:
    def test_reply_claiming_an_unknown_id_is_rejected(self) -> None:
        node = KademliaNode(KadId(1), "me", KademliaConfig(ksize=4), rng=random.Random(0))
        node.receive("a", encode(Ping(9, A)), now=0.0)
        _, eff = node.find_node(KadId(7), now=1.0)
        query = eff.sends[0]
        with pytest.raises(ProtocolError, match="another id"):
            node.receive("a", encode(Nodes(query.message.rpc_id, KadId(12345), ())), now=1.1)
        assert node.routing.contacts() == [Contact(A, "a")]

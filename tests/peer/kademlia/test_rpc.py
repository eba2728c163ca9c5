"""The codec round-trips every message; malformed or lying messages are rejected with
ProtocolError and leave the node's table untouched."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actorpy.errors import ProtocolError
from engines.peer.kademlia.events import KademliaConfig
from engines.peer.kademlia.ids import KadId, id_to_bytes
from engines.peer.kademlia.node import KademliaNode
from engines.peer.kademlia.routing import Contact
from engines.peer.kademlia.rpc import (PROTOCOL_VERSION, FindNode, FindValue, Kind, Nodes, Ping,
                                       Pong, Store, Stored, Value, brief, decode, encode)

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


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


# Anything a peer could put in a message: scalars (ints far past 4 300 digits and floats past
# 1e308 included), containers nested a few levels, and types the codec never produces.
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10 ** 4400, max_value=10 ** 4500),
    st.floats(allow_nan=True, allow_infinity=True), st.binary(max_size=40),
    st.text(max_size=20), st.just(bytes(20)), st.just(id_to_bytes(A)))
ANY = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.lists(inner, max_size=5).map(tuple),
    st.dictionaries(st.text(max_size=3), inner, max_size=3)), max_leaves=12)
VALID_WIRES = [encode(m) for m in MESSAGES]
HOSTILE = [
    b"\x01\x05", None, 7, 10 ** 5000, {"kind": 1}, 1.5, "PING", [], (), _nested(100_000),
    (10 ** 5000, 1, 0, bytes(20)), (1, 10 ** 5000, 0, bytes(20)), (1, 1, 10 ** 5000, bytes(20)),
    (1, 3, 0, bytes(20), bytes(20), b"v", 10 ** 400), (1, 3, 0, bytes(20), bytes(20), b"v", 1e300),
    (_nested(100_000), 1, 0, bytes(20)), (1, _nested(100_000), 0, bytes(20)),
    (1, 6, 0, bytes(20), _nested(100_000)), (1, 6, 0, bytes(20), [_nested(100_000)]),
    (1, 6, 0, bytes(20), [(bytes(20), _nested(100_000))]),
]


class TestHostileInput:
    """Every malformed input ends as a ProtocolError with the routing table untouched: a shell
    that catches only ProtocolError must never be stopped by one packet."""

    def _node(self) -> KademliaNode:
        node = KademliaNode(KadId(1), "me", KademliaConfig(ksize=4), rng=random.Random(0))
        node.receive("a", encode(Ping(9, A)), now=0.0)
        return node

    def _check(self, node: KademliaNode, wire: object) -> bool:
        before = TestNodeRejects._snapshot(TestNodeRejects(), node)
        try:
            node.receive("evil", wire, now=1.0)
        except ProtocolError:
            assert TestNodeRejects._snapshot(TestNodeRejects(), node) == before
            return False
        return True

    @pytest.mark.parametrize("wire", HOSTILE, ids=lambda w: brief(w, 20))
    def test_each_reported_defect_is_a_protocol_error(self, wire: object) -> None:
        with pytest.raises(ProtocolError):
            decode(wire)
        assert not self._check(self._node(), wire)

    def test_brief_never_raises(self) -> None:
        assert brief(10 ** 5000) == "an int of 16610 bits"
        assert brief(_nested(100_000)) == "list of length 1"
        assert brief(object()).startswith("a ")

    def _codec_accepts(self, wire: object) -> bool:
        try:
            decode(wire, max_contacts=4)
        except ProtocolError:
            return False
        return True

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(wire=ANY)
    def test_arbitrary_values(self, wire: object) -> None:
        codec_ok = self._codec_accepts(wire)
        accepted = self._check(self._node(), wire)   # raises if anything but ProtocolError
        assert codec_ok or not accepted               # what the codec refuses, the node refuses

    @settings(max_examples=400, deadline=None)
    @given(base=st.sampled_from(VALID_WIRES), data=st.data())
    def test_valid_messages_with_one_field_replaced(self, base: tuple, data: st.DataObject) -> None:
        position = data.draw(st.integers(0, len(base) - 1))
        wire = base[:position] + (data.draw(ANY),) + base[position + 1:]
        codec_ok = self._codec_accepts(wire)
        accepted = self._check(self._node(), wire)
        assert codec_ok or not accepted

"""The codec round-trips every message (values out of band); malformed or lying messages are
rejected with ProtocolError and leave the node's table untouched."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actorpy.errors import ProtocolError
from engines.peer.kademlia.events import KademliaConfig
from engines.peer.kademlia.ids import KadId, id_to_bytes
from engines.peer.kademlia.node import KademliaNode
from engines.peer.kademlia.routing import Contact
from engines.peer.kademlia.rpc import (MAX_ARGS, PROTOCOL_VERSION, Call, FindNode, FindValue,
                                       Kind, Leave, Nodes, Ping, Pong, Reply, Step, Store,
                                       Stored, Value, brief, decode, encode, value_frames)
from engines.peer.kademlia.values import Blob

V = PROTOCOL_VERSION
A, B = KadId(0xA << 150), KadId(0xB << 150)
MESSAGES = [
    Ping(1, A), Pong(2, A, step=7), Stored(3, A, 4, B), Stored(3, A, 4, B, refused=True),
    FindNode(4, A, B), FindValue(5, A, B),
    Store(6, A, B, b"\x00" * 100, 60.0, clock=3, writer=A, step=2),
    Store(6, A, B, b"\x00" * 100, 60.0, clock=3, writer=A, step=2, base=1),
    Value(7, A, B, np.arange(6, dtype=np.float64).reshape(2, 3), clock=9, writer=B),
    Value(7, A, B, Blob.of(np.ones(2)).stamped(((A, 4), (KadId(1), 0))), clock=9, writer=B),
    Store(6, A, B, Blob.of(b"w").stamped(((B, 2**63 - 1),)), 60.0, clock=3, writer=A, base=2),
    Reply(14, A, 1, (5,), Blob.of(np.zeros(3)).stamped(((B, 7),))),
    Nodes(8, A, (Contact(B, "tcp://10.0.0.2:9"), Contact(KadId(1), "n1"))),
    Leave(0, A, step=5), Step(0, A, step=6),
    Call(9, A, 3, B, (1, 2.5, "w", b"x", None), np.ones(4, np.float32), 1),
    Call(10, A, 1, B), Reply(11, A, 2, (7,), None, 3), Reply(12, A, 1, (), b"model"),
    Reply(13, A, 1, (), None, 4, ((B, 9), (KadId(5), 0))),
]


def round_trip(msg: object) -> object:
    """What a peer receives: the plain values and copies of the value frames."""
    frames = [bytes(f) for f in value_frames(msg)]  # type: ignore[arg-type]
    return decode(encode(msg), frames)  # type: ignore[arg-type]


class TestCodec:
    @pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: m.KIND.name)
    def test_round_trip_through_plain_values(self, msg: object) -> None:
        wire = encode(msg)  # type: ignore[arg-type]
        assert wire[:2] == (PROTOCOL_VERSION, int(msg.KIND))  # type: ignore[attr-defined]
        assert wire[4] == msg.step  # type: ignore[attr-defined]
        assert all(isinstance(x, (int, float, bytes, str, list, type(None))) for x in wire)
        assert round_trip(msg) == msg
        frames = list(value_frames(msg))  # type: ignore[arg-type]
        assert decode(list(wire), frames) == msg

    def test_kinds_are_this_packages_own_enum(self) -> None:
        assert {m.KIND for m in MESSAGES} == set(Kind)

    def test_values_travel_out_of_band(self) -> None:
        weights = np.arange(1000, dtype=np.float32)
        msg = Store(1, A, B, weights, 60.0, clock=5, writer=A)
        wire, frames = encode(msg), value_frames(msg)
        assert len(frames) == 1 and frames[0].nbytes == weights.nbytes
        assert np.shares_memory(np.frombuffer(frames[0], np.float32), weights)   # zero-copy
        assert sum(len(x) for x in wire if isinstance(x, bytes)) < 100          # not inside
        got = decode(wire, [bytes(frames[0])])
        assert isinstance(got, Store) and (got.clock, got.writer) == (5, A)
        np.testing.assert_array_equal(got.value.to_value(), weights)

    def test_tensors_and_bytes_come_back_as_themselves(self) -> None:
        torch = pytest.importorskip("torch")
        tensor = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
        got = round_trip(Value(1, A, B, tensor))
        assert isinstance(got, Value) and torch.equal(got.value.to_value(), tensor)
        assert round_trip(Value(1, A, B, b"raw")).value.to_value() == b"raw"  # type: ignore

    @pytest.mark.parametrize("descriptor, frame, reason", [
        ([1, "<f4", [3]], bytes(8), "says 12"),                # size mismatch
        ([1, "|O", [1]], bytes(8), "not allowed"),              # object dtype: never
        ([1, "<f4", [-1]], bytes(4), "size"),
        ([1, "<f4", [10 ** 30]], bytes(4), "size"),
        ([1, "<f4", [2] * 40], bytes(4), "at most"),
        ([5, "<f4", [1]], bytes(4), "kind"),
        ([2, "float99", [1]], bytes(4), "not allowed"),
        ([0, "|u1", [2, 2]], bytes(4), "one dimension"),
        ("desc", bytes(4), "descriptor"),
        ([1, "<f8", [1 << 18]], b"", "over the limit"),
    ])
    def test_bad_value_descriptors_are_rejected(self, descriptor: object, frame: bytes,
                                               reason: str) -> None:
        wire = (PROTOCOL_VERSION, 8, 0, bytes(20), -1, bytes(20), descriptor, 0, bytes(20))
        with pytest.raises(ProtocolError, match=reason):
            decode(wire, [frame], max_value_bytes=1 << 20)

    def test_value_frames_must_match_the_descriptors(self) -> None:
        msg = Value(1, A, B, b"abc")
        with pytest.raises(ProtocolError, match="without its frame"):
            decode(encode(msg))
        with pytest.raises(ProtocolError, match="too many"):
            decode(encode(Ping(1, A)), [b"x"])
        with pytest.raises(ProtocolError, match="too many"):
            decode(encode(msg), [b"abc", b"def"])
        with pytest.raises(ProtocolError, match="sequence"):
            decode(encode(msg), b"abc")  # type: ignore[arg-type]

    @pytest.mark.parametrize("wire, reason", [
        ("ping", "tuple"),
        ((1, 1, 0, bytes(20), -1), "version"),
        ((V, 42, 0, bytes(20), -1), "unknown"),
        ((V, True, 0, bytes(20), -1), "unknown"),
        ((V, 1, -1, bytes(20), -1), "rpc_id"),
        ((V, 1, 1.5, bytes(20), -1), "rpc_id"),
        ((V, 1, True, bytes(20), -1), "rpc_id"),
        ((V, 1, 0, bytes(19), -1), "20 bytes"),
        ((V, 1, 0, "x" * 20, -1), "bytes"),
        ((V, 1, 0, bytes(20), -2), "step"),
        ((V, 1, 0, bytes(20), 1 << 63), "step"),
        ((V, 1, 0, bytes(20), "3"), "step"),
        ((V, 1, 0, bytes(20), -1, b"extra"), "fields"),
        ((V, 12, 0, bytes(20), -1, 5), "fields"),
        ((V, 12, 0, bytes(20), -2), "step"),
        ((V - 1, 12, 0, bytes(20), 5), "version"),
        ((V, 5, 0, bytes(20), -1, bytes(21)), "20 bytes"),
        ((V, 3, 0, bytes(20), -1, bytes(20), "text", 5.0, 0, bytes(20), -1), "descriptor"),
        ((V, 3, 0, bytes(20), -1, bytes(20), None, 5.0, 0, bytes(20), -1), "descriptor"),
        ((V, 3, 0, bytes(20), -1, bytes(20), [0, "|u1", [1]], -1.0, 0, bytes(20), -1),
         "ttl"),
        ((V, 3, 0, bytes(20), -1, bytes(20), [0, "|u1", [1]], float("inf"), 0, bytes(20),
         -1), "ttl"),
        ((V, 3, 0, bytes(20), -1, bytes(20), [0, "|u1", [1]], 5.0, -1, bytes(20), -1),
         "clock"),
        ((V, 3, 0, bytes(20), -1, bytes(20), [0, "|u1", [1]], 5.0, 1, bytes(20), -2), "base"),
        ((V, 3, 0, bytes(20), -1, bytes(20), [0, "|u1", [1]], 5.0, 1, bytes(20), "0"), "base"),
        ((V, 3, 0, bytes(20), -1, bytes(20), [0, "|u1", [1]], 5.0, 1, bytes(20)), "fields"),
        ((V, 4, 0, bytes(20), -1, 0, b"w", 0), "20 bytes"),
        ((V, 4, 0, bytes(20), -1, 0, bytes(20), 2), r"refused must be an int in \[0, 1\]"),
        ((V, 4, 0, bytes(20), -1, 0, bytes(20), True), "refused must be an int"),
        ((V, 6, 0, bytes(20), -1, [(bytes(20), "a")] * 2), "duplicate"),
        ((V, 6, 0, bytes(20), -1, [(bytes(20 - 1), "a")]), "20 bytes"),
        ((V, 6, 0, bytes(20), -1, [(bytes(20), "")]), "address"),
        ((V, 6, 0, bytes(20), -1, [(bytes(20), 5)]), "address"),
        ((V, 6, 0, bytes(20), -1, [bytes(20)]), "pair"),
        ((V, 6, 0, bytes(20), -1, {"a": 1}), "list"),
        ((V, 10, 0, bytes(20), -1, 1, bytes(20), [[1]], None), "args are"),
        ((V, 10, 0, bytes(20), -1, 1, bytes(20), [1] * (MAX_ARGS + 1), None), "at most"),
        ((V, 10, 0, bytes(20), -1, 1, bytes(20), [1 << 64], None), "64-bit"),
        ((V, 10, 0, bytes(20), -1, 1, bytes(20), [float("nan")], None), "finite"),
        ((V, 10, 0, bytes(20), -1, 1, bytes(20), ["x" * 300], None), "at most"),
        ((V, 10, 0, bytes(20), -1, 1 << 20, bytes(20), [], None), "method"),
        ((V, 11, 0, bytes(20), -1, -1, [], None, []), "status"),
        ((V, 11, 0, bytes(20), -1, 1, [], None, [[bytes(20)]]), "pair"),
        ((V, 11, 0, bytes(20), -1, 1, [], None, [[bytes(20), -1]]), "peer step"),
        ((V, 11, 0, bytes(20), -1, 1, [], None, [[bytes(3), 1]]), "20 bytes"),
        ((V, 11, 0, bytes(20), -1, 1, [], None, [[bytes(20), 1]] * 65), "at most"),
    ])
    def test_malformed_messages_are_rejected(self, wire: object, reason: str) -> None:
        with pytest.raises(ProtocolError, match=reason):
            decode(wire, [b"x"])      # a frame for the value kinds: the fault is elsewhere

    def test_huge_contact_lists_are_rejected(self) -> None:
        contacts = [(id_to_bytes(i + 1), f"n{i}") for i in range(10_000)]
        with pytest.raises(ProtocolError, match="limit"):
            decode((V, 6, 0, bytes(20), -1, contacts))
        with pytest.raises(ProtocolError, match="limit"):
            decode((V, 6, 0, bytes(20), -1, contacts[:21]), max_contacts=20)


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
        ("evil", (V, 5, 0, bytes(3), -1, bytes(20))),             # short sender id
        ("evil", (V, 6, 0, bytes(20), -1, [(bytes(20), "x")] * 5)),  # more than ksize contacts
        ("evil", (V, 7, 0, bytes(20), -1, 12345)),                   # wrong type
        ("evil", encode(Leave(0, A))),                               # another's LEAVE
        ("evil", encode(Step(0, A, 3))),                             # another's STEP
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
            node.receive("a", encode(Value(query.message.rpc_id, A, KadId(7), b"x")), now=1.1,
                         frames=[b"x"])


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
    st.none(), st.booleans(), st.integers(),
    st.integers(min_value=10 ** 4400, max_value=10 ** 4500),
    st.floats(allow_nan=True, allow_infinity=True), st.binary(max_size=40),
    st.text(max_size=20), st.just(bytes(20)), st.just(id_to_bytes(A)))
ANY = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.lists(inner, max_size=5).map(tuple),
    st.dictionaries(st.text(max_size=3), inner, max_size=3)), max_leaves=12)
VALID = [(encode(m), [bytes(f) for f in value_frames(m)]) for m in MESSAGES]
HOSTILE = [
    b"\x01\x05", None, 7, 10 ** 5000, {"kind": 1}, 1.5, "PING", [], (), _nested(100_000),
    (10 ** 5000, 1, 0, bytes(20), -1), (V, 10 ** 5000, 0, bytes(20), -1),
    (V, 1, 10 ** 5000, bytes(20), -1), (V, 1, 0, bytes(20), 10 ** 5000),
    (V, 3, 0, bytes(20), -1, bytes(20), [0, "|u1", [1]], 10 ** 400, 0, bytes(20)),
    (V, 3, 0, bytes(20), -1, bytes(20), [0, "|u1", [1]], 1e300, 0, bytes(20)),
    (V, 3, 0, bytes(20), -1, bytes(20), [0, "|u1", [10 ** 5000]], 5.0, 0, bytes(20)),
    (V, 3, 0, bytes(20), -1, bytes(20), [0, "|u1", _nested(100_000)], 5.0, 0, bytes(20)),
    (_nested(100_000), 1, 0, bytes(20), -1), (V, _nested(100_000), 0, bytes(20), -1),
    (V, 6, 0, bytes(20), -1, _nested(100_000)), (V, 6, 0, bytes(20), -1, [_nested(100_000)]),
    (V, 6, 0, bytes(20), -1, [(bytes(20), _nested(100_000))]),
    (V, 10, 0, bytes(20), -1, 1, bytes(20), _nested(100_000), None),
    (V, 10, 0, bytes(20), -1, 1, bytes(20), [10 ** 5000], None),
    # value stamps: not a list, a pair that is not one, a bad id, a step out of range, an
    # id twice, too many, nested too deep
    (V, 8, 0, bytes(20), -1, bytes(20), [0, "|u1", [1], 5], 0, bytes(20)),
    (V, 8, 0, bytes(20), -1, bytes(20), [0, "|u1", [1], [[bytes(20)]]], 0, bytes(20)),
    (V, 8, 0, bytes(20), -1, bytes(20), [0, "|u1", [1], [[b"id", 1]]], 0, bytes(20)),
    (V, 8, 0, bytes(20), -1, bytes(20), [0, "|u1", [1], [[bytes(20), -1]]], 0, bytes(20)),
    (V, 8, 0, bytes(20), -1, bytes(20), [0, "|u1", [1], [[bytes(20), 10 ** 5000]]], 0,
     bytes(20)),
    (V, 8, 0, bytes(20), -1, bytes(20), [0, "|u1", [1], [[bytes(20), 1]] * 2], 0, bytes(20)),
    (V, 8, 0, bytes(20), -1, bytes(20),
     [0, "|u1", [1], [[i.to_bytes(20, "big"), 1] for i in range(4097)]], 0, bytes(20)),
    (V, 8, 0, bytes(20), -1, bytes(20), [0, "|u1", [1], _nested(100_000)], 0, bytes(20)),
]


class TestHostileInput:
    """Every malformed input ends as a ProtocolError with the routing table untouched: a shell
    that catches only ProtocolError must never be stopped by one packet."""

    def _node(self) -> KademliaNode:
        node = KademliaNode(KadId(1), "me", KademliaConfig(ksize=4), rng=random.Random(0))
        node.receive("a", encode(Ping(9, A)), now=0.0)
        return node

    def _check(self, node: KademliaNode, wire: object, frames: list = []) -> bool:
        before = TestNodeRejects._snapshot(TestNodeRejects(), node)
        try:
            node.receive("evil", wire, now=1.0, frames=frames)
        except ProtocolError:
            assert TestNodeRejects._snapshot(TestNodeRejects(), node) == before
            return False
        return True

    @pytest.mark.parametrize("wire", HOSTILE, ids=lambda w: brief(w, 20))
    def test_each_reported_defect_is_a_protocol_error(self, wire: object) -> None:
        with pytest.raises(ProtocolError):
            decode(wire, [b"x"])
        assert not self._check(self._node(), wire, [b"x"])

    def test_brief_never_raises(self) -> None:
        assert brief(10 ** 5000) == "an int of 16610 bits"
        assert brief(_nested(100_000)) == "list of length 1"
        assert brief(object()).startswith("a ")

    def _codec_accepts(self, wire: object, frames: object = ()) -> bool:
        try:
            decode(wire, frames, max_contacts=4)  # type: ignore[arg-type]
        except ProtocolError:
            return False
        return True

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(wire=ANY)
    def test_arbitrary_values(self, wire: object) -> None:
        codec_ok = self._codec_accepts(wire)
        accepted = self._check(self._node(), wire)   # raises if anything but ProtocolError
        assert codec_ok or not accepted               # what the codec refuses, the node refuses

    @settings(max_examples=500, deadline=None)
    @given(base=st.sampled_from(VALID), data=st.data())
    def test_valid_messages_with_one_field_replaced(self, base: tuple, data: st.DataObject) -> None:
        wire, frames = base
        position = data.draw(st.integers(0, len(wire) - 1))
        wire = wire[:position] + (data.draw(ANY),) + wire[position + 1:]
        if frames and data.draw(st.booleans()):
            frames = data.draw(st.sampled_from([[], frames * 2, [b"short"], [frames[0][:-1]]]))
        codec_ok = self._codec_accepts(wire, frames)
        accepted = self._check(self._node(), wire, frames)
        assert codec_ok or not accepted

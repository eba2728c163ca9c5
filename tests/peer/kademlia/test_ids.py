"""XOR metric laws (paper 2.1) and id encoding."""
from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actorpy.errors import ProtocolError
from engines.peer.kademlia.ids import (ID_BITS, ID_SPACE, distance, id_from_bytes, id_to_bytes,
                                       key_id, random_id, shared_prefix_len)

ids = st.integers(min_value=0, max_value=ID_SPACE - 1)


class TestXorMetric:
    @given(ids, ids)
    def test_identity_and_symmetry(self, a: int, b: int) -> None:
        assert distance(a, a) == 0
        assert (distance(a, b) == 0) == (a == b)
        assert distance(a, b) == distance(b, a)

    @given(ids, ids, ids)
    def test_triangle_inequality(self, a: int, b: int, c: int) -> None:
        assert distance(a, c) <= distance(a, b) + distance(b, c)

    @given(ids, ids)
    def test_unidirectional(self, a: int, d: int) -> None:
        # for each point and distance there is exactly one point at that distance
        b = a ^ d
        assert distance(a, b) == d
        assert [x for x in (b, b ^ 1) if distance(a, x) == d] == [b]

    @given(ids, ids)
    def test_prefix_length_orders_distance(self, a: int, b: int) -> None:
        p = shared_prefix_len(a, b)
        assert 0 <= p <= ID_BITS
        if a != b:
            assert 2 ** (ID_BITS - p - 1) <= distance(a, b) < 2 ** (ID_BITS - p)


class TestIds:
    def test_key_ids_are_sha1_sized_and_stable(self) -> None:
        assert key_id("model/w") == key_id(b"model/w") != key_id("model/b")
        assert 0 <= key_id("x") < ID_SPACE

    def test_random_ids_come_from_the_injected_rng(self) -> None:
        first = [random_id(random.Random(5)) for _ in range(2)]
        assert first[0] == first[1]
        assert len({random_id(random.Random(i)) for i in range(50)}) == 50

    @given(ids)
    def test_bytes_round_trip(self, a: int) -> None:
        assert id_from_bytes(id_to_bytes(a)) == a

    @pytest.mark.parametrize("bad", [b"", bytes(19), bytes(21), "x" * 20, 7, None])
    def test_wrong_ids_are_rejected(self, bad: object) -> None:
        with pytest.raises(ProtocolError):
            id_from_bytes(bad)

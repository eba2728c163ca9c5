"""Stored blocks round-trip exactly, whatever their shape (pure)."""
from __future__ import annotations

import operator
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from engines.mapre import shuffle
from engines.mapre.codec import pack, pack_columns, unpack

TEXT = st.text(alphabet=st.sampled_from(["a", "\x00", "é", " ", "日"]), max_size=4)
ITEMS = st.one_of(
    st.lists(TEXT),
    st.lists(st.tuples(TEXT, st.one_of(st.integers(), st.none(), st.lists(st.integers())))),
    st.lists(st.one_of(TEXT, st.integers(), st.tuples(TEXT, st.integers()))),
)


class TestCodec:
    @given(ITEMS)
    @settings(max_examples=200, deadline=None)
    def test_round_trip(self, items):
        assert unpack(pack(items)) == items

    def test_common_shapes_go_column_wise(self):
        assert pack(["a", "b", "c"]) == ("s", "a\x00b\x00c")
        assert pack([("a", 1), ("b", [2])]) == ("p", "a\x00b", [1, [2]])
        assert pack(["a\x00", "b"]) == ["a\x00", "b"]          # the separator itself: plain
        assert pack([("a", 1), ("b", 2, 3)]) == [("a", 1), ("b", 2, 3)]

    @given(st.dictionaries(st.one_of(TEXT, st.integers()), st.integers()))
    @settings(max_examples=200, deadline=None)
    def test_columns_pack_as_the_pairs_do(self, mapping):
        keys, values = list(mapping), list(mapping.values())
        assert pack_columns(keys, values) == pack(list(mapping.items()))

    @given(st.dictionaries(st.one_of(TEXT, st.integers()), st.integers()), st.integers(1, 5))
    @settings(max_examples=200, deadline=None)
    def test_a_dicts_items_chunk_as_its_pairs_do(self, mapping, size):
        """combined_chunks reads a dict's items view column-wise: the same chunks as the
        pairs (chunk size forced small, so several chunks are made)."""
        with mock.patch.object(shuffle, "chunk_items", lambda items: size):
            fast = shuffle.combined_chunks(mapping.items(), operator.add)
            pairs = shuffle.combined(iter(mapping.items()), operator.add)
            assert fast == (list(shuffle.chunked(pairs, size)), len(mapping))

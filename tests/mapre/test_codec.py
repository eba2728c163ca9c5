"""Stored blocks round-trip exactly, whatever their shape (pure)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engines.mapre.codec import pack, unpack

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

"""The plan: narrow steps fuse into one node, stages are cut at shuffles (pure, no cluster)."""
from __future__ import annotations

from itertools import chain

from hypothesis import given, settings
from hypothesis import strategies as st

from engines.mapre import plan as P
from engines.mapre.ops import Step, apply_ops, describe_ops


def _source(n: int = 3) -> P.ItemsSource:
    return P.ItemsSource(tuple([i] for i in range(n)))


class TestFusion:
    def test_narrow_steps_fuse_into_one_node(self):
        node = _source()
        for op in [(Step.FLAT_MAP, str.split), (Step.MAP, str.lower), (Step.FILTER, str.isalpha),
                   (Step.MAP, len)]:
            node = P.narrow(node, op)
        assert isinstance(node, P.Narrow) and isinstance(node.parent, P.ItemsSource)
        assert len(node.ops) == 4
        assert describe_ops(node.ops) == "flat_map(str.split) -> map(str.lower) -> " \
                                         "filter(str.isalpha) -> map(len)"

    def test_cache_and_shuffle_stop_fusion(self):
        cached = P.Cache(P.narrow(_source(), (Step.MAP, str)), "k")
        after = P.narrow(cached, (Step.MAP, len))
        assert after.parent is cached
        shuffle = P.Shuffle((after,), P.ShuffleKind.DISTINCT, 2)
        top = P.narrow(shuffle, (Step.MAP, str))
        assert top.parent is shuffle and top.partitions == 2

    def test_stages_are_cut_at_shuffles(self):
        a = P.Shuffle((P.narrow(_source(4), (Step.MAP, str)),), P.ShuffleKind.DISTINCT, 2)
        b = P.Shuffle((a, _source(2)), P.ShuffleKind.JOIN, 3)
        assert list(P.input_shuffles(P.narrow(b, (Step.MAP, str)))) == [b]
        assert [s.kind for s in P.input_shuffles(b.parents[0])] == [P.ShuffleKind.DISTINCT]
        assert P.count_stages(b) == 3
        sort = P.Shuffle((P.Cache(_source(), "", job_scoped=True),), P.ShuffleKind.SORT_BY, 2)
        assert P.count_stages(sort) == 3  # sample, map side, result

    def test_a_complete_cache_hides_what_is_below_it(self):
        shuffle = P.Shuffle((_source(2),), P.ShuffleKind.DISTINCT, 2)
        cache = P.Cache(shuffle, "k")
        assert list(P.input_shuffles(cache)) == [shuffle]
        cache.record(0, "w1", 1)
        cache.record(1, "w2", 1)
        assert list(P.input_shuffles(cache)) == []
        cache.forget({"w2"})
        assert list(P.input_shuffles(cache)) == [shuffle] and cache.where(0) == ("w1", 1)

    def test_union_locates_partitions(self):
        u = P.Union((_source(2), _source(3)))
        assert u.partitions == 5
        assert u.locate(3) == (u.parents[1], 1)


class TestApplyOps:
    @given(st.lists(st.text(alphabet="ab \t", max_size=8), max_size=20))
    @settings(max_examples=60, deadline=None)
    def test_fused_pipeline_equals_plain_python(self, lines):
        ops = ((Step.FLAT_MAP, str.split), (Step.MAP, str.upper),
               (Step.FILTER, lambda w: len(w) > 1), (Step.MAP, lambda w: (w, 1)),
               (Step.MAP_PARTITIONS, lambda it: sorted(it)), (Step.FLATTEN, None))
        expected = list(chain.from_iterable(sorted(
            (w.upper(), 1) for line in lines for w in line.split() if len(w) > 1)))
        assert list(apply_ops(lines, ops)) == expected

    def test_map_partitions_must_return_an_iterable(self):
        import pytest

        with pytest.raises(TypeError, match="must return an iterable"):
            list(apply_ops([1], ((Step.MAP_PARTITIONS, lambda it: None),)))

    def test_nothing_runs_until_consumed(self):
        seen = []
        it = apply_ops([1, 2, 3], ((Step.MAP, lambda x: seen.append(x) or x),))
        assert seen == []
        assert next(it) == 1 and seen == [1]

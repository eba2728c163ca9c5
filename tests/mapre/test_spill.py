"""Shuffles and results several times larger than a worker's store budget spill to disk,
finish with the right output, and leave nothing behind."""
from __future__ import annotations

from typing import Any, Iterator

import actorpy
from engines import mapre
from engines.mapre.broadcast import store_stats
from tests.mapre.conftest import stored_keys

BUDGET = 4 << 20
PAD = "x" * 1000


class StoreUse:
    """Task: this worker's (spilled bytes, memory bytes, keys)."""

    def run(self, ctx: Any) -> tuple[int, int, int]:
        s = ctx.store.stats()
        return s.spilled_bytes, s.memory_bytes, s.keys


def _summarise_groups(groups: Iterator[Any]) -> Iterator[Any]:
    # runs in the reduce task, while the map outputs it reads are still stored
    for k, values in groups:
        yield (k, len(values), sum(len(v) for v in values))
    yield ("spilled", store_stats().spilled_bytes, 0)


class TestSpill:
    def test_shuffle_bigger_than_the_budget_spills_and_is_cleaned_up(self):
        items = [(i % 997, f"{i}{PAD}") for i in range(40_000)]  # ~40 MB through the shuffle
        with actorpy.connect(workers=2, store_budget_bytes=BUDGET) as cluster:
            out = (mapre.from_items(cluster, items, partitions=8)
                   .group_by_key(partitions=4)
                   .map_partitions(_summarise_groups)
                   .collect(timeout_s=300))
            after = [cluster.submit_task(StoreUse(), w).result(30) for w in cluster.workers()]
            left = stored_keys(cluster)
        spilled = sum(n for k, n, _ in out if k == "spilled")
        assert spilled > 4 * BUDGET  # most of the ~40 MB of map outputs went to disk
        expected: dict = {}
        for k, v in items:
            n, size = expected.get(k, (0, 0))
            expected[k] = (n + 1, size + len(v))
        assert {k: (n, s) for k, n, s in out if k != "spilled"} == expected
        assert left == 0
        assert [a[0] for a in after] == [0, 0]  # every spill file deleted with its block

    def test_big_results_stream_back_through_a_small_budget(self):
        lines = [f"{i} {PAD}" for i in range(30_000)]  # ~30 MB of results, stored and spilled
        with actorpy.connect(workers=2, store_budget_bytes=BUDGET) as cluster:
            got = (mapre.from_items(cluster, lines, partitions=2)
                   .map(str.upper).collect(timeout_s=300))
            left = stored_keys(cluster)
        assert got == [s.upper() for s in lines]
        assert left == 0

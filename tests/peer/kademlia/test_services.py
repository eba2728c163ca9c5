"""Overlay services: size_estimate from id density, and sample_peers ~ uniform over live peers."""
from __future__ import annotations

import collections
import random

import pytest

from engines.peer.kademlia.ids import shared_prefix_len
from engines.peer.kademlia.services import lookup_size_estimate, sample_depth
from engines.peer.kademlia.sim import SimNetwork

from .conftest import FAST, grown


class TestSizeEstimate:
    @pytest.mark.parametrize("fixture, n", [("net200", 200), ("net1000", 1000)])
    def test_mean_over_nodes_within_15_percent(self, fixture: str, n: int,
                                               request: pytest.FixtureRequest) -> None:
        net: SimNetwork = request.getfixturevalue(fixture)
        estimates = [net.nodes[a].size_estimate() for a in net.alive]
        mean = sum(estimates) / len(estimates)
        assert abs(mean - n) <= 0.15 * n

    def test_small_networks_are_counted(self) -> None:
        net = grown(8, seed=1)
        assert [net.nodes[a].size_estimate() for a in sorted(net.alive)] == [8.0] * 8

    def test_lookup_estimate_uses_the_kth_distance(self, net1000: SimNetwork) -> None:
        rng = random.Random(2)
        estimates = []
        for _ in range(30):
            target = rng.getrandbits(160)
            closest = net1000.true_closest(target, 20)
            estimate = lookup_size_estimate(target, closest, 20)
            assert estimate is not None
            estimates.append(estimate)
        assert abs(sum(estimates) / len(estimates) - 1000) <= 0.15 * 1000
        assert lookup_size_estimate(0, closest[:5], 20) is None


def cell_share(ids: list[int], node_id: int) -> float:
    """Exact chance that ``node_id`` is the closest node to a uniform random id."""
    levels = {shared_prefix_len(node_id, other) for other in ids if other != node_id}
    return 2.0 ** -len(levels)


class TestSamplePeers:
    def test_closest_to_random_id_is_biased(self) -> None:
        # what the sampler corrects: the naive method is far from uniform on the same overlay
        net = grown(30, seed=30)
        ids = [net.nodes[a].node_id for a in net.alive]
        shares = [cell_share(ids, i) * len(ids) for i in ids]
        assert abs(sum(shares) - len(ids)) < 1e-9
        assert max(abs(s - 1.0) for s in shares) > 0.5

    def test_frequencies_within_20_percent_of_uniform_over_10k_samples(self) -> None:
        net = grown(30, seed=30)
        me = "n0"
        peers = sorted(net.alive - {me})
        rng = random.Random(31)
        counts: collections.Counter[str] = collections.Counter()
        drawn = 0
        while drawn < 10_000:
            sample = net.sample_peers(me, 8, rng)
            assert len(sample) == len({c.node_id for c in sample}) == 8
            counts.update(c.address for c in sample)
            drawn += len(sample)
        expected = drawn / len(peers)
        assert set(counts) == set(peers)                    # never ourselves
        assert max(abs(counts[p] / expected - 1.0) for p in peers) <= 0.20

    def test_only_live_peers_are_sampled(self) -> None:
        net = SimNetwork(FAST, seed=12)
        net.grow(120)
        victims = set(net.kill_fraction(0.25, random.Random(13), keep=frozenset({"n0"})))
        rng = random.Random(14)
        seen: set[str] = set()
        for _ in range(15):
            sample = net.sample_peers("n0", 8, rng)
            assert len(sample) == 8
            seen |= {c.address for c in sample}
        assert not seen & victims and len(seen) > 60

    def test_sample_depth_targets_a_fraction_of_k(self) -> None:
        assert [sample_depth(n, 20) for n in (5, 12, 24, 100, 1000, 10**6)] == [0, 0, 1, 3, 6, 16]

"""Overlay services: size_estimate from id density, and sample_peers ~ uniform over live peers."""
from __future__ import annotations

import collections
import dataclasses
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

    def test_follows_the_table_as_contacts_come_and_go(self) -> None:
        # the estimate is cached per routing-table version: a change must show at once
        net = grown(8, seed=1)
        node = net.nodes[sorted(net.alive)[0]]
        assert node.size_estimate() == 8.0
        version = node.routing.version
        gone = node.routing.contacts()[0]
        node.routing.remove(gone.node_id)
        assert node.routing.version > version
        assert node.size_estimate() == 7.0
        node.routing.observe(gone, now=0.0)
        assert node.size_estimate() == 8.0

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

    @pytest.mark.parametrize("beta", [1, 3, 8])
    def test_per_peer_frequencies_are_uniform_over_25k_samples_at_n100(
            self, net100: SimNetwork, beta: int) -> None:
        # Pearson's chi-square over the 99 other peers: a uniform sampler gives ~98 +- 14
        # (draws within one call are without replacement, which only narrows it), so 190 fails
        # it with chance < 1e-7; the old sampler scored ~1050 at beta = 1.
        counts, drawn, peers = draw_counts(net100, "n0", beta, 25_000, random.Random(beta))
        expected = drawn / len(peers)
        chi2 = sum((counts[p] - expected) ** 2 / expected for p in peers)
        assert chi2 < 190
        assert max(abs(counts[p] / expected - 1.0) for p in peers) <= 0.35

    def test_uniform_without_the_subtree_cache(self) -> None:
        net = grown(30, seed=30, config=dataclasses.replace(FAST, sample_cache_s=0.0))
        counts, drawn, peers = draw_counts(net, "n0", 4, 2_400, random.Random(31))
        expected = drawn / len(peers)
        chi2 = sum((counts[p] - expected) ** 2 / expected for p in peers)
        assert chi2 < 28 + 7 * (2 * 28) ** 0.5       # df = 28
        assert net.nodes["n0"].subtrees.members(0, 0, net.clock.now()) is None

    def test_a_cached_overlay_samples_without_messages(self) -> None:
        net = grown(200, seed=201)
        node, rng = net.nodes["n0"], random.Random(202)
        net.sample_peers("n0", 8, rng)
        first = node.stats.rpcs_sent
        for _ in range(40):
            net.sample_peers("n0", 8, rng)
        assert first > 0
        # every subtree is known after a few samples; later ones cost nothing
        assert node.stats.rpcs_sent - first <= 2 * first
        rpcs = node.stats.rpcs_sent
        assert len(net.sample_peers("n0", 8, rng)) == 8 and node.stats.rpcs_sent == rpcs

    def test_sample_cached_draws_what_sample_peers_would(self) -> None:
        # the barrier's shortcut (``sample_cached``) must be the same draw, with the same
        # rng use and op ids, as the operation it skips; and draw nothing until cached
        net = grown(30, seed=30)
        node, now = net.nodes["n0"], net.clock.now()
        fresh = grown(30, seed=30, config=dataclasses.replace(FAST, sample_cache_s=0.0))
        rng = random.Random(5)
        assert fresh.nodes["n0"].sample_cached(3, rng, now) is None
        assert rng.getstate() == random.Random(5).getstate()
        net.sample_peers("n0", 3, random.Random(1))           # fills the cache
        for beta in (1, 3, 40):
            a, b = random.Random(beta), random.Random(beta)
            ops = node._next_op
            picks = node.sample_cached(beta, a, now)
            assert picks is not None and node._next_op == ops + 1
            op_id, eff = node.sample_peers(beta, b, now)
            assert op_id == ops + 1 and list(eff.done[0].contacts) == picks and not eff.sends
            assert a.getstate() == b.getstate()
            assert len(picks) == min(beta, 29)

    def test_small_overlays_give_everyone(self) -> None:
        net = grown(8, seed=8)
        sample = net.sample_peers("n3", 20, random.Random(9))
        assert {c.address for c in sample} == net.alive - {"n3"}
        assert net.sample_peers("n3", 0, random.Random(9)) == []

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

    def test_dead_peers_leave_the_cache_and_newcomers_enter_it(self) -> None:
        net = SimNetwork(FAST, seed=15)
        net.grow(80)
        rng = random.Random(16)
        net.sample_peers("n0", 8, rng)                       # fills n0's subtree cache
        node = net.nodes["n0"]
        victim = net.sample_peers("n0", 1, rng)[0]
        net.kill(victim.address)
        net.find_node("n0", victim.node_id)                  # two misses: given up,
        net.run_for(2 * FAST.rpc_timeout_s)                  # evicted once unanswered
        assert victim.node_id not in node.routing
        assert victim not in cached(net, "n0", victim.node_id)
        newcomer = net.add_node()
        net.join(newcomer, "n0")                             # n0 hears from it
        assert net.contact(newcomer) in cached(net, "n0", net.nodes[newcomer].node_id)
        assert net.contact(newcomer) in net.sample_peers("n0", 80, rng)

class TestMembers:
    @pytest.mark.parametrize("fixture", ["net100", "net1000"])
    def test_every_live_peer_is_found(self, fixture: str, request: pytest.FixtureRequest) -> None:
        net: SimNetwork = request.getfixturevalue(fixture)
        done = net.run_op("n5", lambda node, now: node.members(random.Random(3), now))
        assert {c.address for c in done.contacts} == net.alive - {"n5"}

    def test_dead_peers_are_not_members(self) -> None:
        net = SimNetwork(FAST, seed=17)
        net.grow(100)
        victims = set(net.kill_fraction(0.25, random.Random(18), keep=frozenset({"n0"})))
        done = net.run_op("n0", lambda node, now: node.members(random.Random(3), now))
        assert {c.address for c in done.contacts} == net.alive - {"n0"}
        assert not victims & {c.address for c in done.contacts}


def draw_counts(net: SimNetwork, me: str, beta: int, total: int,
                rng: random.Random) -> tuple[collections.Counter[str], int, list[str]]:
    """Sample until ``total`` peers were drawn; every call must give ``beta`` distinct peers."""
    counts: collections.Counter[str] = collections.Counter()
    drawn = 0
    while drawn < total:
        sample = net.sample_peers(me, beta, rng)
        assert len(sample) == len({c.node_id for c in sample}) == beta
        counts.update(c.address for c in sample)
        drawn += len(sample)
    peers = sorted(net.alive - {me})
    assert set(counts) == set(peers)                         # never ourselves, everyone else
    return counts, drawn, peers


def cached(net: SimNetwork, address: str, node_id: int) -> set:
    """Every contact ``address``'s subtree cache lists around ``node_id``, at any depth."""
    cache = net.nodes[address].subtrees
    found: set = set()
    for depth in range(12):
        found |= set(cache.members(node_id, depth, net.clock.now()) or ())
    return found

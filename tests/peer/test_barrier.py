"""The overlay barrier: PSP draws uniformly through the overlay and reads piggy-backed steps,
PINGing only peers whose known step would block; BSP/SSP see every peer; ASP sends nothing."""
from __future__ import annotations

import collections
import random

import pytest

from actorpy.barrier import ASP, BSP, PSP, SSP, StepView
from actorpy.errors import ConfigError
from actorpy.ids import NodeId
from engines.peer.barrier import OverlayBarrier
from engines.peer.kademlia.events import Effects, KademliaConfig
from engines.peer.kademlia.sim import SimNetwork
from engines.peer.view import OverlayView

CONFIG = KademliaConfig(refresh_on_join=False)


def overlay(n: int, seed: int, steps: dict[int, int]) -> SimNetwork:
    """``n`` nodes; node i reports step ``steps.get(i, 10)``."""
    net = SimNetwork(CONFIG, seed=seed)
    for i, address in enumerate(net.grow(n)):
        net.nodes[address].step = steps.get(i, 10)
    return net


def decide(net: SimNetwork, barrier: OverlayBarrier, my_step: int) -> object:
    """Run one check to its decision on the simulated network."""
    decision, eff = barrier.check(my_step, net.clock.now())
    while decision is None:
        net.apply("n0", Effects(sends=eff.sends, timers=eff.timers))
        mine = [d for d in eff.done if barrier.owns(d.op_id)]
        eff = Effects()
        while not mine:
            net.clock.run_until(net.clock.next_due())  # type: ignore[arg-type]
            mine = [d for k, d in list(net.results.items())
                    if k[0] == "n0" and barrier.owns(d.op_id)]
            for k in [k for k, d in net.results.items() if d in mine]:
                del net.results[k]
        for done in mine:
            decision, more = barrier.on_done(done, net.clock.now())
            eff.extend(more)
    net.apply("n0", eff)
    return decision


class TestOverlayView:
    def test_is_a_step_view_whose_subsets_are_uniform(self) -> None:
        view = OverlayView({NodeId(f"p{i}"): i for i in range(6)}, population=40,
                           rng=random.Random(1))
        assert isinstance(view, StepView) and view.population() == 40
        assert len(view.sample(10)) == 6 and len(view.steps()) == 6
        counts = collections.Counter(p for _ in range(6000) for p in view.sample(2))
        assert max(counts.values()) / min(counts.values()) < 1.15
        with pytest.raises(ConfigError):
            view.sample(-1)


class TestOverlayBarrier:
    def test_asp_decides_without_a_message(self) -> None:
        net = overlay(10, seed=1, steps={})
        decision, eff = OverlayBarrier(net.nodes["n0"], ASP(), random.Random(0)).check(
            99, net.clock.now())
        assert decision is not None and decision.advance and eff.sends == []

    def test_psp_pings_only_the_peers_that_would_block(self) -> None:
        net = overlay(12, seed=2, steps={0: 10, 7: 3})
        barrier = OverlayBarrier(net.nodes["n0"], PSP(11, 1), random.Random(1))
        decision = decide(net, barrier, 10)
        assert not decision.advance and decision.waiting_on == ("n7",)  # type: ignore
        first = barrier.records[-1]
        assert len(first.seen) == 11 and first.seen["n7"] == 3
        # the second check knows everyone's step: only the laggard is asked again
        decision = decide(net, barrier, 10)
        assert barrier.records[-1].pinged == 1 and barrier.records[-1].rpcs == 0
        net.nodes["n7"].step = 9                       # it caught up (within staleness 1)
        decision = decide(net, barrier, 10)
        assert decision.advance and barrier.records[-1].seen["n7"] == 9  # type: ignore

    def test_bsp_and_ssp_see_every_peer(self) -> None:
        net = overlay(30, seed=3, steps={4: 8})
        for policy, advance in ((BSP(), False), (SSP(2), True), (SSP(1), False)):
            barrier = OverlayBarrier(net.nodes["n0"], policy, random.Random(2))
            decision = decide(net, barrier, 10)
            assert len(barrier.records[-1].seen) == 29
            assert decision.advance is advance  # type: ignore[attr-defined]

    def test_dead_sampled_peers_are_left_out(self) -> None:
        net = overlay(8, seed=4, steps={3: 0})
        barrier = OverlayBarrier(net.nodes["n0"], BSP(), random.Random(3))
        assert not decide(net, barrier, 10).advance  # type: ignore[attr-defined]
        net.kill("n3")
        decision = decide(net, barrier, 10)            # its PINGs time out: evicted
        assert decision.advance and "n3" not in barrier.records[-1].seen  # type: ignore

    def test_a_blocking_peer_that_pushes_to_us_is_not_pinged(self) -> None:
        net = overlay(6, seed=5, steps={0: 10, 3: 3})
        n3 = net.nodes["n3"].node_id
        for policy, pinged in ((SSP(2), 0), (BSP(), 1)):   # without staleness: asked
            barrier = OverlayBarrier(net.nodes["n0"], policy, random.Random(4))
            assert not decide(net, barrier, 10).advance  # type: ignore[attr-defined]
            barrier.pushing = lambda node_id, now: node_id == n3   # its next push tells
            assert not decide(net, barrier, 10).advance  # type: ignore[attr-defined]
            assert barrier.records[-1].pinged == pinged and barrier.records[-1].seen["n3"] == 3
        barrier = OverlayBarrier(net.nodes["n0"], SSP(2), random.Random(4))
        assert not decide(net, barrier, 10).advance  # type: ignore[attr-defined]
        net.nodes["n3"].step = 8                    # not pushing to us: asked, caught up
        assert decide(net, barrier, 10).advance  # type: ignore[attr-defined]
        assert barrier.records[-1].pinged == 1

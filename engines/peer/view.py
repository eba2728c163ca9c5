"""The barrier's view of other peers on the overlay: a ``StepView`` (actorpy.barrier.view).

A P2P peer has no table of everyone's steps. For each barrier check it draws peers through the
overlay (``KademliaNode.sample_peers`` for PSP, ``members`` for BSP/SSP) and reads their steps
from messages they already sent (``steps.StepTable``); ``barrier.OverlayBarrier`` gathers
them. ``OverlayView`` is the snapshot the shared policy then decides on, so PSP over the
overlay is the same ``PSP.decide`` the PS engine runs over its full table.

>>> import random
>>> view = OverlayView({NodeId("a"): 4, NodeId("b"): 2}, population=9, rng=random.Random(0))
>>> sorted(view.steps().items()), view.population(), len(view.sample(1))
([('a', 4), ('b', 2)], 9, 1)
"""
from __future__ import annotations

import random
from typing import Mapping

from actorpy.errors import ConfigError
from actorpy.ids import NodeId


class OverlayView:
    """Steps of the peers one barrier check drew from the overlay (never the deciding peer).

    ``sample(size)`` returns the drawn peers themselves when ``size`` covers them (the overlay
    already drew them uniformly, afresh for this check), or a uniform subset of them.

    Args:
        steps: peer -> completed steps, for every peer this check drew (copied).
        population: how many other peers the overlay holds (an estimate).
        rng: for subsets smaller than what was drawn.
    """

    def __init__(self, steps: Mapping[NodeId, int], population: int,
                 rng: random.Random) -> None:
        self._steps = dict(steps)
        self._population = max(population, len(self._steps))
        self._rng = rng

    def steps(self) -> Mapping[NodeId, int]:
        """Every drawn peer's steps."""
        return dict(self._steps)

    def sample(self, size: int) -> Mapping[NodeId, int]:
        """``size`` of the drawn peers, uniformly without replacement (all if fewer)."""
        if size < 0:
            raise ConfigError(f"sample size must be >= 0, got {size}")
        if size >= len(self._steps):
            return dict(self._steps)
        chosen = self._rng.sample(sorted(self._steps), size)
        return {node: self._steps[node] for node in chosen}

    def population(self) -> int:
        """The number of other peers (estimated from the overlay's id density)."""
        return self._population

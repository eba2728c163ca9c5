"""Views: where a barrier gets the steps of the *other* workers.

Sampling is separate from deciding (Wang et al. 2017, §4: "only the sampled states instead
of the global states are passed into the barrier function"). A PS server hands its table to
:class:`FullView`; :class:`SampledView` turns any SSP decision into its probabilistic
version; the P2P engine implements :class:`StepView` over peers sampled through Kademlia.
"""
from __future__ import annotations

import random
from typing import Mapping, Protocol, runtime_checkable

from actorpy.errors import ConfigError
from actorpy.ids import NodeId


@runtime_checkable
class StepView(Protocol):
    """The steps a deciding worker can see. What an implementer must provide:

    * ``steps()``: a mapping node -> completed steps of every *other* worker this view
      can see (never the deciding worker itself). BSP/SSP/DSSP read it.
    * ``sample(size)``: ``min(size, population())`` *distinct* other workers drawn
      uniformly at random without replacement, with their steps, **freshly drawn on every
      call** (a blocked worker re-samples at each re-check). When ``size >= population()``
      it returns all of them. PSP reads it. Randomness comes from an rng the view was
      given, never from global state.
    * ``population()``: how many other workers there are (an estimate is fine in P2P,
      e.g. from the overlay's id density).

    Steps may be slightly stale (a P2P peer answers with what it last knew); policies only
    read, never write, a view.
    """

    def steps(self) -> Mapping[NodeId, int]: ...

    def sample(self, size: int) -> Mapping[NodeId, int]: ...

    def population(self) -> int: ...


def _others(table: Mapping[NodeId, int], exclude: NodeId | None) -> dict[NodeId, int]:
    return {node: step for node, step in table.items() if node != exclude}


def _draw(others: Mapping[NodeId, int], size: int, rng: random.Random | None,
          who: str) -> dict[NodeId, int]:
    if size < 0:
        raise ConfigError(f"sample size must be >= 0, got {size}")
    if size >= len(others):
        return dict(others)
    if rng is None:
        raise ConfigError(f"{who} cannot sample without an rng: pass rng=random.Random(seed)")
    # Sorting first makes the draw depend on the seed only, not on the table's order.
    chosen = rng.sample(sorted(others), size)
    return {node: others[node] for node in chosen}


class FullView:
    """A server's whole table of node -> completed steps (the deciding node excluded).

    Args:
        table: node -> completed steps; read, never modified (copied at construction).
        exclude: the deciding node, if it is in ``table``.
        rng: needed only if a PSP policy samples fewer than all of the others.

    >>> view = FullView({NodeId("a"): 3, NodeId("b"): 5}, exclude=NodeId("a"))
    >>> view.steps(), view.population()
    ({'b': 5}, 1)
    """

    def __init__(self, table: Mapping[NodeId, int], exclude: NodeId | None = None,
                 rng: random.Random | None = None) -> None:
        self._others = _others(table, exclude)
        self._rng = rng

    def steps(self) -> Mapping[NodeId, int]:
        """Every other worker's steps."""
        return dict(self._others)

    def sample(self, size: int) -> Mapping[NodeId, int]:
        """``size`` others without replacement (all of them if ``size >= population``)."""
        return _draw(self._others, size, self._rng, "FullView")

    def population(self) -> int:
        """Number of other workers in the table."""
        return len(self._others)


class SampledView:
    """Only ``size`` random others are visible, redrawn at every call (PSP's primitive).

    ``SSP(s).decide(c, SampledView(table, β, rng))`` makes the same decisions, with the same
    seed, as ``PSP(β, s).decide(c, FullView(table, rng=rng))``.

    Args:
        table: node -> completed steps (copied).
        size: β >= 0, how many others each call sees.
        rng: the source of the samples (``random.Random(seed)``).
        exclude: the deciding node, if it is in ``table``.

    >>> import random
    >>> view = SampledView({NodeId(c): i for i, c in enumerate("abcd")}, 2, random.Random(1))
    >>> len(view.steps()), view.population()
    (2, 4)
    """

    def __init__(self, table: Mapping[NodeId, int], size: int, rng: random.Random,
                 exclude: NodeId | None = None) -> None:
        if size < 0:
            raise ConfigError(f"SampledView size must be >= 0, got {size}")
        self._others = _others(table, exclude)
        self._size = size
        self._rng = rng

    def steps(self) -> Mapping[NodeId, int]:
        """A fresh sample of ``size`` others."""
        return _draw(self._others, self._size, self._rng, "SampledView")

    def sample(self, size: int) -> Mapping[NodeId, int]:
        """A fresh sample of ``min(size, self.size)`` others."""
        return _draw(self._others, min(size, self._size), self._rng, "SampledView")

    def population(self) -> int:
        """Number of other workers behind the view (not the sample size)."""
        return len(self._others)

"""Barrier policies: may a worker that has completed ``me_step`` steps start its next one?

Every policy answers with a frozen :class:`Decision` and never mutates what it reads.
The rule shared by the SSP family (Ho et al. 2013; Wang, Catterall, Mortier 2017, §3):

    a worker at step ``c`` may start its next step  iff  ``c - min(view) <= s``

i.e. iff no visible worker has completed fewer than ``c - s`` steps. We count *completed*
steps, so BSP (s = 0) lets me start step ``c + 1`` only once everyone has completed ``c``;
the spread (max - min completed steps) then never exceeds ``s + 1``. An empty view never
blocks (a lone worker, or PSP with β = 0, is ASP).

The policies:

* :class:`SSP` ``(staleness=s)``, :class:`BSP` ``()`` = SSP(0), :class:`ASP` ``()``
  (always advance);
* :class:`PSP` ``(sample=β, staleness=s)``: the same rule over a fresh sample of β other
  workers drawn without replacement (``view.sample(β)``). pBSP is s = 0, pSSP is s > 0;
  β = 0 is ASP and β >= population is exactly SSP(s);
* :class:`DSSP` ``(low, high)``: SSP whose bound is ``low + granted`` with the grant chosen
  at run time by :class:`actorpy.barrier.dssp.DSSPController`.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable

from actorpy.barrier.view import StepView
from actorpy.errors import ConfigError
from actorpy.ids import NodeId


@dataclass(frozen=True)
class Decision:
    """What a barrier decided.

    Attributes:
        advance: True if the worker may start its next step now.
        waiting_on: the visible workers that block it (sorted, so the decision does not
            depend on the order in which the view listed them); empty when advancing.
    """

    advance: bool
    waiting_on: tuple[NodeId, ...] = ()


@runtime_checkable
class Policy(Protocol):
    """What every barrier offers to an engine: one pure decision."""

    def decide(self, me_step: int, view: StepView) -> Decision:
        """Decide whether a worker that completed ``me_step`` steps may start the next."""
        ...


def _whole(policy: object, name: str, what: str) -> None:
    """Check ``policy.name`` is an integer >= 0 (a numpy one too: a sweep over
    ``np.arange(5)`` was refused) and keep it as a plain int (its repr, its pickle)."""
    value = getattr(policy, name)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{what} must be an integer >= 0, got {value!r}")
    object.__setattr__(policy, name, int(value))   # a frozen dataclass's own field


def _check_staleness(policy: object, name: str = "staleness") -> None:
    _whole(policy, name, name if name == "staleness" else f"{name} (a staleness)")


def lagging(me_step: int, steps: Mapping[NodeId, int], staleness: int) -> tuple[NodeId, ...]:
    """The workers in ``steps`` more than ``staleness`` steps behind ``me_step``, sorted.

    >>> lagging(5, {NodeId("b"): 1, NodeId("a"): 4, NodeId("c"): 0}, 3)
    ('b', 'c')
    """
    floor = me_step - staleness
    return tuple(sorted(node for node, step in steps.items() if step < floor))


@dataclass(frozen=True)
class SSP:
    """Stale Synchronous Parallel: advance iff ``me_step - min(view.steps()) <= staleness``.

    Args:
        staleness: s >= 0; how many steps I may be ahead of the slowest worker I see.

    >>> from actorpy.barrier.view import FullView
    >>> table = {NodeId("a"): 3, NodeId("b"): 1}
    >>> SSP(staleness=2).decide(3, FullView(table))
    Decision(advance=True, waiting_on=())
    >>> SSP(staleness=1).decide(3, FullView(table))
    Decision(advance=False, waiting_on=('b',))
    """

    staleness: int = 0

    def __post_init__(self) -> None:
        _check_staleness(self)

    def decide(self, me_step: int, view: StepView) -> Decision:
        """Apply the rule to every step the view can see (see the class docstring)."""
        waiting = lagging(me_step, view.steps(), self.staleness)
        return Decision(not waiting, waiting)


@dataclass(frozen=True)
class BSP(SSP):
    """Bulk Synchronous Parallel: SSP(0); start step c + 1 only when all completed c.

    >>> from actorpy.barrier.view import FullView
    >>> BSP().decide(2, FullView({NodeId("a"): 2, NodeId("b"): 1})).waiting_on
    ('b',)
    """

    staleness: int = field(default=0, init=False)


@dataclass(frozen=True)
class ASP:
    """Asynchronous Parallel: always advance (the view is not even read).

    >>> ASP().decide(10**6, None).advance
    True
    """

    def decide(self, me_step: int, view: StepView | None) -> Decision:
        """Always ``Decision(True, ())``."""
        return Decision(True, ())


@dataclass(frozen=True)
class PSP:
    """Probabilistic Synchronous Parallel: SSP(staleness) over ``view.sample(sample)``.

    Each call draws a *fresh* sample of β other workers without replacement, so a blocked
    worker that re-checks (whenever some worker completes a step) sees a new sample.
    β = 0 never reads the view (ASP); β >= the population reads all of it (SSP(s)).

    Args:
        sample: β >= 0, how many other workers to sample at each check.
        staleness: s >= 0; 0 gives pBSP, > 0 gives pSSP.

    >>> import random
    >>> from actorpy.barrier.view import FullView
    >>> table = {NodeId(f"w{i}"): 7 for i in range(9)} | {NodeId("slow"): 0}
    >>> PSP(sample=9, staleness=0).decide(7, FullView(table, rng=random.Random(0)))
    Decision(advance=False, waiting_on=('slow',))
    >>> PSP(sample=0).decide(7, FullView(table)).advance
    True
    """

    sample: int
    staleness: int = 0

    def __post_init__(self) -> None:
        _whole(self, "sample", "sample (beta)")
        _check_staleness(self)

    def decide(self, me_step: int, view: StepView) -> Decision:
        """Sample β others from the view and apply SSP(staleness) to the sample."""
        if self.sample == 0:
            return Decision(True, ())
        waiting = lagging(me_step, view.sample(self.sample), self.staleness)
        return Decision(not waiting, waiting)

    def pass_probability(self, n_lagging: int, population: int) -> float:
        """Chance that one check passes when ``n_lagging`` of ``population`` others lag.

        That is the hypergeometric probability that a sample of β drawn without
        replacement contains none of the laggards: C(N - L, β) / C(N, β). The fast
        simulator uses it; tests check it against :meth:`decide` over real samples.

        >>> PSP(sample=1).pass_probability(1, 4)
        0.75
        >>> PSP(sample=4).pass_probability(1, 4)
        0.0
        """
        beta = min(self.sample, population)
        free = population - n_lagging
        if n_lagging <= 0 or beta == 0:
            return 1.0
        if free < beta:
            return 0.0
        p = 1.0
        for i in range(beta):  # C(N-L, β)/C(N, β) = Π (N-L-i)/(N-i)
            p *= (free - i) / (population - i)
        return p


@dataclass(frozen=True)
class DSSP:
    """Dynamic SSP (Zhao, An, Liu, Chen, ICDCS 2019): staleness in ``[low, high]``.

    The bound is ``low + granted``, with ``granted`` in ``[0, high - low]`` chosen at run
    time by :class:`~actorpy.barrier.dssp.DSSPController` from push timestamps; nobody is
    ever let more than ``high`` ahead. Used alone (granted = 0) it is SSP(low).

    >>> from actorpy.barrier.view import FullView
    >>> view = FullView({NodeId("a"): 0})
    >>> DSSP(low=1, high=4).decide(3, view).advance, DSSP(low=1, high=4).decide(3, view, 2).advance
    (False, True)
    """

    low: int
    high: int

    def __post_init__(self) -> None:
        _check_staleness(self, "low")
        _check_staleness(self, "high")
        if self.high < self.low:
            raise ConfigError(f"DSSP needs low <= high, got low={self.low} high={self.high}")

    @property
    def max_extra(self) -> int:
        """The largest grant, ``high - low``."""
        return self.high - self.low

    def decide(self, me_step: int, view: StepView, granted: int = 0) -> Decision:
        """SSP with staleness ``low + granted`` (``granted`` clipped to ``[0, high - low]``)."""
        bound = self.low + min(max(granted, 0), self.max_extra)
        waiting = lagging(me_step, view.steps(), bound)
        return Decision(not waiting, waiting)

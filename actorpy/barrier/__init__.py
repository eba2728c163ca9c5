"""Barrier control shared by every engine, and the simulator (pure: no sockets, no clock).

Files:
    policy.py    Decision, Policy protocol; BSP, SSP(s), ASP, PSP(β, s), DSSP(low, high)
    view.py      StepView protocol (what the P2P engine implements); FullView, SampledView
    dssp.py      DSSPController: grants the fastest worker extra staleness from push times
    lbbsp.py     LBBSPController (per-worker batch sizes from measured times); weighted_average
    bounds.py    psp_bounds: the PSP paper's bounds on the mean and variance of the lag
    workload.py  Workload: iteration-time distributions and straggler models for simulation
    sim.py       simulate(policy, SimConfig) -> SimResult; the reference engine
    fastsim.py   the fast event loop behind simulate (bucketed waits, PSP hazards)
    plot.py      CDF plots of per-worker steps (imports matplotlib lazily)
    cli.py       `actorpy sim` / `python -m actorpy.barrier.cli`

>>> from actorpy.barrier import SSP, FullView
>>> from actorpy.ids import NodeId
>>> SSP(staleness=2).decide(4, FullView({NodeId("a"): 1, NodeId("b"): 3}))
Decision(advance=False, waiting_on=('a',))
"""
from __future__ import annotations

from typing import Any

from actorpy.barrier.bounds import PSPBounds, psp_bounds
from actorpy.barrier.dssp import DSSPController, Grant
from actorpy.barrier.lbbsp import LBBSPController, weighted_average
from actorpy.barrier.policy import ASP, BSP, DSSP, PSP, SSP, Decision, Policy
from actorpy.barrier.view import FullView, SampledView, StepView

__all__ = [
    "ASP", "BSP", "DSSP", "PSP", "SSP", "Decision", "Policy",
    "FullView", "SampledView", "StepView",
    "DSSPController", "Grant", "LBBSPController", "weighted_average",
    "PSPBounds", "psp_bounds", "SimConfig", "SimResult", "simulate", "Workload",
]


def __getattr__(name: str) -> Any:
    # The simulator needs numpy; an engine that only asks for a policy does not load it.
    if name in ("SimConfig", "SimResult", "simulate"):
        from actorpy.barrier import sim

        return getattr(sim, name)
    if name == "Workload":
        from actorpy.barrier.workload import Workload

        return Workload
    raise AttributeError(f"module 'actorpy.barrier' has no attribute {name!r}")

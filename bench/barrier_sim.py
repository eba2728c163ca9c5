"""Benchmark of the barrier simulator (prints a table; asserts nothing).

Big run: every barrier with 1000 workers x 1000 simulated seconds on the fast engine.
Baseline, in the same run: the reference engine (policy.decide with a real FullView on every
check of every blocked worker, as a PS server would do it) against the fast engine on a
smaller problem the reference engine can finish, printed as a ratio.

    python bench/barrier_sim.py [--workers 1000] [--seconds 1000] [--small 100]
    python bench/barrier_sim.py --paper    # the tables in docs/barrier.md (10 seeds)
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from actorpy.barrier import ASP, BSP, DSSP, PSP, SSP, SimConfig, simulate

POLICIES = [BSP(), SSP(4), ASP(), PSP(10, 0), PSP(10, 4), DSSP(2, 6)]
# Ratios to ASP read off the Owl book's step-progress figure (papers.md).
OWL = {"BSP": 0.14, "SSP(4)": 0.56, "pBSP(10)": 0.64, "pSSP(10,4)": 0.90, "ASP": 1.0}


def paper(seeds: int) -> None:
    """The PSP paper's experiment: 200 workers, 200 s, exponential(1 s), several seeds."""
    def runs(policy):
        res = [simulate(policy, SimConfig(200, 200.0, seed=s)) for s in range(seeds)]
        return (float(np.mean([r.stats()["mean"] for r in res])),
                float(np.mean([r.stats()["std"] for r in res])),
                float(np.mean([r.stats()["max"] - r.stats()["min"] for r in res])))
    asp = runs(ASP())[0]
    print("| barrier | mean steps | std | max-min | / ASP | Owl figure / ASP |")
    print("|---|---:|---:|---:|---:|---:|")
    named = [("BSP", BSP()), ("SSP(4)", SSP(4)), ("pBSP(10)", PSP(10, 0)),
             ("pSSP(10,4)", PSP(10, 4)), ("DSSP(2,6)", DSSP(2, 6)), ("ASP", ASP())]
    for name, policy in named:
        mean, std, width = runs(policy)
        print(f"| {name} | {mean:.1f} | {std:.2f} | {width:.1f} | {mean / asp:.3f} | "
              f"{OWL.get(name, '-')} |")
    print()
    print("| β (pBSP) | mean steps | std | max-min | / ASP |")
    print("|---:|---:|---:|---:|---:|")
    for beta in (0, 1, 2, 4, 8, 16, 32, 64, 199):
        mean, std, width = runs(PSP(beta, 0))
        print(f"| {beta} | {mean:.1f} | {std:.2f} | {width:.1f} | {mean / asp:.3f} |")


def timed(policy, config, engine="fast"):
    start = time.perf_counter()
    result = simulate(policy, config, engine=engine)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=1000.0)
    parser.add_argument("--small", type=int, default=100, help="workers = seconds of the baseline")
    parser.add_argument("--paper", action="store_true", help="print the docs' tables instead")
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    if args.paper:
        paper(args.seeds)
        return
    big = SimConfig(workers=args.workers, seconds=args.seconds, seed=0)
    small = SimConfig(workers=args.small, seconds=args.small, seed=0)
    print(f"fast engine: {big.workers} workers x {big.seconds:g} s | baseline: reference vs fast, "
          f"{small.workers} workers x {small.seconds:g} s")
    print(f"{'barrier':<28} {'wall s':>7} {'pushes':>9} {'pushes/s':>10} |"
          f" {'ref s':>7} {'fast s':>7} {'ratio':>7}")
    for policy in POLICIES:
        wall, result = timed(policy, big)
        ref_wall, ref = timed(policy, small, "reference")
        fast_wall, fast = timed(policy, small)
        print(f"{result.barrier:<28} {wall:>7.2f} {result.total_updates:>9d} "
              f"{result.total_updates / wall:>10.0f} | {ref_wall:>7.2f} {fast_wall:>7.3f} "
              f"{ref_wall / fast_wall:>6.0f}x")


if __name__ == "__main__":
    main()

"""``actorpy sim``: simulate barriers, compare them, plot step CDFs, print PSP bounds.

    actorpy sim --workers 200 --seconds 200 --barrier pssp --sample 10 --staleness 4 --json
    actorpy sim --compare bsp ssp:4 asp pbsp:10 pssp:10:4 --plot barriers.png
    actorpy sim --barrier pbsp --sweep-sample 0 1 2 4 8 16 32 64 --plot sweep.png
    actorpy sim --bounds --staleness 4 --sweep-sample 1 5 100 --lag-cdf 0.5 --updates 10000

Also runnable as ``python -m actorpy.barrier.cli``. Bad arguments exit with status 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from actorpy.barrier.bounds import psp_bounds
from actorpy.barrier.policy import ASP, BSP, DSSP, PSP, SSP, Policy
from actorpy.barrier.sim import SimConfig, SimResult, simulate
from actorpy.barrier.workload import DISTRIBUTIONS, Workload
from actorpy.errors import ConfigError

BARRIERS = ("bsp", "ssp", "asp", "pbsp", "pssp", "dssp")


def make_policy(name: str, staleness: int | None = None, sample: int = 10,
                dssp_low: int = 2, dssp_high: int = 6) -> Policy:
    """Build a policy from CLI words; ``staleness`` None means 4 for ssp/pssp.

    >>> make_policy("pssp", sample=10)
    PSP(sample=10, staleness=4)
    """
    if name == "bsp":
        return BSP()
    if name == "asp":
        return ASP()
    if name == "ssp":
        return SSP(staleness=4 if staleness is None else staleness)
    if name == "pbsp":
        if staleness not in (None, 0):
            raise ConfigError("pbsp has staleness 0; use --barrier pssp for staleness > 0")
        return PSP(sample=sample, staleness=0)
    if name == "pssp":
        return PSP(sample=sample, staleness=4 if staleness is None else staleness)
    if name == "dssp":
        return DSSP(low=dssp_low, high=dssp_high)
    raise ConfigError(f"unknown barrier {name!r}; choose from {', '.join(BARRIERS)}")


#: PSP's sample size when --sample is not given
SAMPLE = 10


def _check_flags(args: argparse.Namespace) -> None:
    """A flag the run would not use is an error, not dropped without a word (before,
    ``--barrier dssp --staleness 9`` ran DSSP(2, 6), ``--bounds --plot f.png`` drew nothing).

    Raises:
        ConfigError: naming the flag and what takes it instead.
    """
    if args.bounds and args.plot is not None:
        raise ConfigError("--bounds prints PSP's lag bounds and draws nothing: leave out --plot")
    if args.bounds:
        return
    if args.compare and (args.staleness is not None or args.sample is not None):
        raise ConfigError("--compare's specs carry their own parameters (ssp:S, pssp:B:S): "
                          "leave out --staleness and --sample")
    if args.compare:
        return
    if args.staleness is not None and args.barrier in ("bsp", "asp", "dssp"):
        raise ConfigError(f"--staleness is for ssp, pbsp and pssp, not {args.barrier}"
                          + (" (it takes --dssp-low and --dssp-high)" if args.barrier == "dssp"
                             else ""))
    if args.sample is not None and args.barrier not in ("pbsp", "pssp"):
        raise ConfigError(f"--sample is PSP's sample size: for pbsp and pssp, not "
                          f"{args.barrier}")
    if args.sample is not None and args.sweep_sample:
        raise ConfigError("--sweep-sample gives the sample sizes: leave out --sample")


def parse_spec(spec: str) -> Policy:
    """``bsp``, ``ssp:S``, ``asp``, ``pbsp:B``, ``pssp:B:S``, ``dssp:LOW:HIGH``.

    >>> parse_spec("pssp:10:4"), parse_spec("dssp:1:5")
    (PSP(sample=10, staleness=4), DSSP(low=1, high=5))
    """
    name, *nums = spec.lower().split(":")
    try:
        args = [int(n) for n in nums]
    except ValueError:
        raise ConfigError(f"bad barrier spec {spec!r}: parameters must be integers") from None
    arity = {"bsp": 0, "asp": 0, "ssp": 1, "pbsp": 1, "pssp": 2, "dssp": 2}
    if name not in arity or len(args) > arity[name]:
        raise ConfigError(f"bad barrier spec {spec!r}; use bsp, ssp:S, asp, pbsp:B, "
                          "pssp:B:S or dssp:LOW:HIGH")
    if name == "ssp":
        return make_policy(name, staleness=args[0] if args else None)
    if name == "pbsp":
        return make_policy(name, sample=args[0] if args else 10)
    if name == "pssp":
        return make_policy(name, sample=args[0] if args else 10,
                           staleness=args[1] if len(args) > 1 else None)
    if name == "dssp":
        low = args[0] if args else 2
        return make_policy(name, dssp_low=low, dssp_high=args[1] if len(args) > 1 else low + 4)
    return make_policy(name)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="actorpy sim", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=200, help="simulated workers P")
    p.add_argument("--seconds", type=float, default=200.0, help="simulated seconds")
    p.add_argument("--barrier", choices=BARRIERS, default="bsp")
    p.add_argument("--staleness", type=int, default=None, help="s (default 4 for ssp/pssp)")
    p.add_argument("--sample", type=int, default=None,
                   help="PSP sample size beta (default 10; pbsp and pssp only)")
    p.add_argument("--dssp-low", type=int, default=2)
    p.add_argument("--dssp-high", type=int, default=6)
    p.add_argument("--dist", choices=DISTRIBUTIONS, default="exp")
    p.add_argument("--mean", type=float, default=1.0, help="mean seconds per iteration")
    p.add_argument("--shape", type=float, default=2.0, help="gamma shape / lognormal sigma")
    p.add_argument("--straggler-frac", type=float, default=0.0)
    p.add_argument("--straggler-slowdown", type=float, default=1.0)
    p.add_argument("--transient-prob", type=float, default=0.0)
    p.add_argument("--transient-slowdown", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine", choices=("fast", "reference"), default="fast",
                   help="fast (default), or reference: the plain one the fast one is checked "
                        "against, for small P (its time grows as P^3: minutes at 1000)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="draw the CDF of per-worker steps")
    p.add_argument("--compare", nargs="+", metavar="SPEC",
                   help="several barriers on one figure: bsp ssp:S asp pbsp:B pssp:B:S dssp:L:H")
    p.add_argument("--sweep-sample", nargs="+", type=int, metavar="B",
                   help="a beta sweep of --barrier (pbsp/pssp), or the betas for --bounds")
    p.add_argument("--bounds", action="store_true", help="print the PSP lag bounds")
    p.add_argument("--lag-cdf", type=float, default=0.5, help="F(r) for --bounds")
    p.add_argument("--updates", type=int, default=10_000, help="T for --bounds")
    return p


def _bounds(args: argparse.Namespace) -> int:
    r = 4 if args.staleness is None else args.staleness
    rows = [{"sample": b, **vars(psp_bounds(r, b, args.lag_cdf, args.updates))}
            for b in (args.sweep_sample or [SAMPLE if args.sample is None else args.sample])]
    if args.json:
        print(json.dumps({"staleness": r, "lag_cdf": args.lag_cdf, "updates": args.updates,
                          "bounds": rows}))
    else:
        print(f"PSP bounds, r={r}, F(r)={args.lag_cdf}, T={args.updates}")
        print(f"{'beta':>6} {'a':>10} {'S':>8} {'mean<=':>10} {'var<':>10}")
        for row in rows:
            print(f"{row['sample']:>6} {row['a']:>10.4g} {row['s']:>8.4f} "
                  f"{row['mean']:>10.3f} {row['variance']:>10.3f}")
    return 0


def _print_table(results: Sequence[SimResult]) -> None:
    asp = next((r.stats()["mean"] for r in results if r.barrier == repr(ASP())), None)
    print(f"{'barrier':<32} {'mean':>8} {'std':>7} {'min':>6} {'p50':>6} {'max':>6}"
          + (f" {'/ASP':>6}" if asp else ""))
    for r in results:
        s = r.stats()
        print(f"{r.barrier:<32} {s['mean']:>8.2f} {s['std']:>7.2f} {s['min']:>6.0f} "
              f"{s['p50']:>6.0f} {s['max']:>6.0f}" + (f" {s['mean'] / asp:>6.3f}" if asp else ""))


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``actorpy sim``; returns the exit status (2 for bad arguments)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): return, don't exit
        return int(exc.code or 0)
    try:
        # before: one of each pair was ignored without a word
        if args.bounds and args.compare:
            raise ConfigError("--bounds prints PSP's lag bounds and simulates nothing: leave "
                              "out --compare")
        if args.compare and args.sweep_sample:
            raise ConfigError("--compare and --sweep-sample both pick the barriers to "
                              "simulate: give one")
        _check_flags(args)
        if args.bounds:
            return _bounds(args)
        if args.plot is not None:
            from actorpy.barrier.plot import check_plot_path
            check_plot_path(args.plot)  # before the simulation, not after it
        workload = Workload(dist=args.dist, mean_s=args.mean, shape=args.shape,
                            straggler_frac=args.straggler_frac,
                            straggler_slowdown=args.straggler_slowdown,
                            transient_prob=args.transient_prob,
                            transient_slowdown=args.transient_slowdown)
        config = SimConfig(workers=args.workers, seconds=args.seconds, workload=workload,
                           seed=args.seed)
        if args.compare:
            policies = [parse_spec(s) for s in args.compare]
        elif args.sweep_sample:
            if args.barrier not in ("pbsp", "pssp"):
                raise ConfigError("--sweep-sample needs --barrier pbsp or pssp")
            policies = [make_policy(args.barrier, args.staleness, b) for b in args.sweep_sample]
        else:
            policies = [make_policy(args.barrier, args.staleness,
                                    SAMPLE if args.sample is None else args.sample,
                                    args.dssp_low, args.dssp_high)]
        results = [simulate(p, config, engine=args.engine) for p in policies]
        if args.plot:
            from actorpy.barrier.plot import plot_cdf
            try:
                plot_cdf(results, args.plot)
            except OSError as exc:
                raise ConfigError(f"cannot write --plot {args.plot}: {exc.strerror or exc}") \
                    from None
    except ConfigError as exc:
        parser.print_usage(sys.stderr)
        print(f"actorpy sim: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = results[0].to_json() if len(results) == 1 else {
            "compare": [r.to_json() for r in results]}
        print(json.dumps(out))
    else:
        _print_table(results)
        if args.plot:
            from actorpy.barrier.plot import plot_file
            print(f"plot written to {plot_file(args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

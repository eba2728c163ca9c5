"""``actorpy kmeans``: k-means (Lloyd's algorithm) as an iterative job over a cached dataset.

Points are generated around ``k`` well separated centres (seeded), cut into numpy blocks and
cached on the workers; each iteration ships the current centres with a ``map`` over the
blocks and a ``reduce`` of per-cluster sums and counts, so only k x dim numbers travel per
block. The run reports how far the centres it found are from the generating ones.

    actorpy kmeans --k 5 --points 200000 --dim 2 --json
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from actorpy import apputil
from actorpy.errors import ActorpyError, ActorpyTimeout, ConfigError
from apps.training import check_memory
from engines import mapre


#: Draws in a row that may miss a place for the next centre before ``make_points`` gives up:
#: 20 centres in 2-D, the most that fit in practice, needed up to 8.5k; 25 never fit (~1 s).
MAX_MISSES = 100_000


#: Each block is a task at every iteration, about 1 ms of scheduling each: 1024 blocks of
#: 20k points took 1 s an iteration on 2 workers, 20k blocks did not finish in 40 s. A few
#: blocks a worker keep the workers busy; more than this only waits.
MAX_PARTITIONS = 1024


def make_points(k: int, points: int, dim: int, seed: int,
                spread: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """``points`` rows around ``k`` centres at least 8 apart (in shuffled order), and the
    centres.

    Raises:
        ValueError: ``k`` centres 8 apart do not fit in ``[-20, 20] ** dim``.
    """
    rng = np.random.default_rng(seed)
    centres: list[np.ndarray] = []
    misses = 0
    while len(centres) < k:
        c = rng.uniform(-20, 20, dim)
        if not centres or np.linalg.norm(np.array(centres) - c, axis=1).min() >= 8:
            centres.append(c)
            misses = 0
        elif (misses := misses + 1) >= MAX_MISSES:
            raise ValueError(f"found room for only {len(centres)} centres 8 apart in "
                             f"[-20, 20]^{dim}, not {k}: ask for fewer (--k) or more "
                             "dimensions (--dim)")
    true = np.array(centres)
    labels = rng.integers(0, k, points)
    return true[labels] + rng.normal(0, spread, (points, dim)), true


def squared_distances(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """``d2[i, j]``: the squared distance from point i to centre j, as |x|^2 - 2 x.c + |c|^2
    (a matrix product: the difference of every pair, n x k x d floats, took 320 MB and
    most of the time at k = 200)."""
    d2 = (x * x).sum(1)[:, None] - 2.0 * (x @ centres.T) + (centres * centres).sum(1)[None, :]
    return np.maximum(d2, 0.0)   # rounding can leave a point's own centre at -1e-12


def partial_sums(block: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-cluster sums and counts of one block's points, and its inertia."""
    d2 = squared_distances(block, centres)
    nearest = d2.argmin(axis=1)
    k = len(centres)
    sums = np.zeros_like(centres)
    np.add.at(sums, nearest, block)
    counts = np.bincount(nearest, minlength=k).astype(np.float64)
    return sums, counts, float(d2[np.arange(len(block)), nearest].sum())


def add_partials(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


def local_kmeans(x: np.ndarray, k: int, rng: np.random.Generator, restarts: int = 5,
                 iterations: int = 20) -> np.ndarray:
    """Greedy k-means++ seeding plus Lloyd's on a sample, best of ``restarts`` (for a good
    start). Each centre is the best of ``2 + ln k`` candidates drawn by k-means++, the one
    that leaves the least squared distance, and each point's distance to its nearest centre
    is kept, not computed again from every centre at each pick (which took minutes at
    k = 200 and, one draw a centre, missed true centres: inertia 4x the best)."""
    best, best_inertia = None, np.inf
    tries = 2 + int(np.log(k))
    for _ in range(restarts):
        c = np.empty((k, x.shape[1]))
        c[0] = x[rng.integers(len(x))]
        nearest = squared_distances(x, c[:1])[:, 0]
        for i in range(1, k):
            total = nearest.sum()   # 0 when every point is a centre already
            picks = rng.choice(len(x), size=tries, p=nearest / total if total > 0 else None)
            left = np.minimum(nearest[:, None], squared_distances(x, x[picks]))
            choice = int(left.sum(0).argmin())
            c[i], nearest = x[picks[choice]], left[:, choice]
        for _ in range(iterations):
            sums, counts, _ = partial_sums(x, c)
            c = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], c)
        inertia = partial_sums(x, c)[2]   # of the centres kept, not of the ones before
        if inertia < best_inertia:
            best, best_inertia = c, inertia
    return best  # type: ignore[return-value]


def kmeans(cluster: Any, points: np.ndarray, k: int, *, partitions: int, iterations: int = 50,
           tol: float = 1e-6, seed: int = 0, timeout_s: float = 600.0) -> dict[str, Any]:
    """Lloyd's algorithm on the cluster; returns centres, iterations, inertia, seconds."""
    partitions = min(partitions, len(points))  # no empty blocks
    blocks = np.array_split(points, partitions)
    data = mapre.from_items(cluster, blocks, partitions=partitions).cache()
    t0 = time.perf_counter()
    try:
        rng = np.random.default_rng(seed)
        want = max(50 * k, 1000)  # sample rows, from as many blocks as that takes
        sample = np.concatenate(data.take(-(-want * partitions // len(points)),
                                          timeout_s=timeout_s))
        sample = sample[rng.permutation(len(sample))[:want]]
        centres = local_kmeans(sample, k, rng)
        done, inertia, shift = 0, float("nan"), 0.0
        for done in range(1, iterations + 1):
            c = centres  # captured by value in the closure below
            sums, counts, inertia = data.map(lambda b: partial_sums(b, c)).reduce(
                add_partials, timeout_s=timeout_s, progress=False)
            new = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], centres)
            shift = float(np.abs(new - centres).max())
            centres = new
            if shift <= tol:
                break
        if shift > tol:   # stopped at --iterations: the inertia is the centres' it returns
            # (before: of those one update earlier)
            c = centres
            inertia = data.map(lambda b: partial_sums(b, c)).reduce(
                add_partials, timeout_s=timeout_s, progress=False)[2]
    finally:
        data.unpersist()
    return {"centres": centres, "iterations": done, "inertia": inertia,
            "seconds": time.perf_counter() - t0}


#: Coordinates of a centre printed (``--json`` gives all of them).
SHOWN_DIMS = 8


def centre_error(found: np.ndarray, true: np.ndarray) -> float:
    """Largest distance from a generating centre to the nearest centre found."""
    return float(np.sqrt(((true[:, None] - found[None]) ** 2).sum(2)).min(1).max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="actorpy kmeans",
                                     description="k-means on generated points, on a cluster.")
    parser.add_argument("--k", type=int, default=5, help="clusters (default 5)")
    parser.add_argument("--points", type=int, default=200_000,
                        help="points generated around k random centres (default 200000)")
    parser.add_argument("--dim", type=int, default=2, help="coordinates per point (default 2)")
    parser.add_argument("--partitions", type=int, default=8,
                        help=f"blocks of points (default 8, at most {MAX_PARTITIONS})")
    parser.add_argument("--iterations", type=int, default=50, help="at most (default 50)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the generated points and of the first centres (default 0)")
    parser.add_argument("--timeout", type=apputil.positive_float, default=600.0, metavar="S",
                        help="seconds each iteration may take (default 600)")
    apputil.add_cluster_arguments(parser)
    args = parser.parse_args(argv)
    small = [f"--{name} {getattr(args, name)}"
             for name in ("k", "points", "dim", "partitions", "iterations")
             if getattr(args, name) < 1]
    if small:   # before: one line listing every flag, whichever was wrong
        parser.error(f"{', '.join(small)}: must be >= 1")
    if args.points < args.k:
        parser.error(f"--points {args.points} is fewer than --k {args.k}: k-means needs a "
                     "point per cluster at least")
    if args.partitions > MAX_PARTITIONS:
        raise ConfigError(f"--partitions {args.partitions} is more than {MAX_PARTITIONS}: each "
                          "is a task at every iteration; a few per worker keep them busy")
    if args.seed < 0:  # numpy seeds only with a non-negative int
        parser.error(f"--seed must be an int >= 0, got {args.seed}")
    # the driver makes the points (three arrays of them at the peak, and the labels); an
    # embedded cluster's workers hold a copy too
    check_memory(args.points * (8 + 8 * args.dim * (3 if args.manager else 4)),
                 "--points and --dim")
    try:
        points, true = make_points(args.k, args.points, args.dim, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        with apputil.connect_from_args(args) as cluster:
            result = kmeans(cluster, points, args.k, partitions=args.partitions,
                            iterations=args.iterations, seed=args.seed,
                            timeout_s=args.timeout)
    except ConfigError:  # bad flags: the command line says so with status 2, as for sgd
        raise
    except ActorpyTimeout as exc:   # the engine's words name its timeout_s=
        print(f"actorpy kmeans: a step did not finish within --timeout {args.timeout:g} s; "
              f"raise --timeout ({apputil.error_line(exc)})", file=sys.stderr)
        return 1
    except ActorpyError as exc:
        print(f"actorpy kmeans: {apputil.error_line(exc)}", file=sys.stderr)
        return 1
    error = centre_error(result["centres"], true)
    if args.json:
        apputil.print_json({"centres": result["centres"].tolist(), "true_centres": true.tolist(),
                            "iterations": result["iterations"], "inertia": result["inertia"],
                            "max_centre_error": error, "seconds": result["seconds"]})
        return 0
    print(f"k-means: {args.points:,} points in {args.dim}-D, k={args.k}, "
          f"{result['iterations']} iterations in {result['seconds']:.2f} s")
    for c in sorted(result["centres"].tolist()):   # --dim 100000 printed 100000 a line
        more = f" ... ({len(c) - SHOWN_DIMS} more; --json has all)" if len(c) > SHOWN_DIMS else ""
        print("  centre " + " ".join(f"{v:8.3f}" for v in c[:SHOWN_DIMS]) + more)
    print(f"largest distance to a generating centre: {error:.4f}")
    return 0


if __name__ == "__main__":
    from apps import run_as_command

    raise SystemExit(run_as_command("kmeans"))

"""Parameter-server benchmark: actorpy's param engine against a hand-written plain-pyzmq PS
and single-process SGD, all in one run.

Run:  .venv/bin/python bench/ps.py                         (the full size: 100 000 x 1000)
      .venv/bin/python bench/ps.py --rows 20000 --features 200 --rate-floats 200000   (small)

Job A: linear regression on ROWS x FEATURES float32 rows with known w* (x ~ N(0, I),
y = x.w* + 0.1 noise), plain SGD (lr 0.002, minibatch 256 per worker), stopped once
|w - w*| / |w*| < 0.05 (checked after every model update); 2 workers each generate and hold
half the rows, 1 server. Reported: seconds from the start barrier (every worker ready) to the
target, worker updates folded, ms per update.

* actorpy: BSP, ASP, pSSP (PSP(1, 4)), DSSP(1, 5) on an embedded 2-worker cluster (the server
  shard lives on one of the two workers, as it would on a 2-node cluster). With
  ``--server-node`` each row also runs, alternating, on a 3-worker cluster's third worker
  (``server_nodes=``: the plain PS's process layout); on 2 cores that is slower (docs/param.md).
* plain pyzmq PS, BSP and ASP: a ROUTER server process and two DEALER worker processes over
  ipc; the gradient goes up as one raw frame, the fresh weights come back in the reply.
* single-process SGD on all the rows, minibatch 256.

Then the same with worker 2 made 3x slower (it sleeps twice its compute time each step),
adding balance=True under BSP (LB-BSP), pSSP and DSSP (LB-pSSP, LB-DSSP: the same batch
sizing keeps the workers' steps in pace, so the staleness bound rarely holds the fast one
back). pSSP, DSSP and LB-BSP also run with the engine's straggler
policy on (``straggler_factor=2``, ``straggler_patience=100``: ``--release-factor``,
``--release-patience``), with and without the straggler: what a user with a persistent
straggler gets (the fast worker goes on alone). Their rows count the workers released (none
should be without the straggler). Each row's runs with and without the straggler alternate
(``--repeat`` times, median reported), so the load of a shared machine drifts less between
the two sides of a "loses" figure. Then the pull-compute-push rate for a model of RATE_FLOATS
float32 (1M by default) with 1 and 2 workers, ASP, against plain pyzmq moving the same bytes
(update up, weights back, the same ``w - lr * g`` on the server). Last, start-up: from before
``connect()`` to the first push reaching the server.

Every process gets one BLAS thread unless ``--blas-threads`` says otherwise (see
``_blas_threads``); ``--only`` runs a few Job A rows and nothing else (``--only many-keys``:
the many-small-keys rows of bench/ps_many.py, also run after Job A's by default).

Targets (printed, never asserted): ms per update <= 1.3x plain in the same mode; 1M-float
rate >= 0.8x plain; with the straggler, pSSP, DSSP and LB-BSP lose < 25 % against their own
no-straggler time (BSP about 70 %); start-up < 1.5 s. (A bounded lead moves at the slowest
worker's pace, docs/param.md: pSSP and DSSP meet it only as far as the straggler's extra
compute hides behind its round trip, which the engine's default ``overlap=True`` lets it do;
``--no-overlap`` runs every actorpy row with each step waiting for its reply. LB-pSSP and
LB-DSSP are the same policies with balanced batches.)

Files: this one has the actorpy callbacks and runs, the report and main; Job A's problem
is in bench/ps_problem.py, the plain-pyzmq PS and single-process SGD in bench/ps_plain.py,
the many-small-keys rows (the engine and their own plain PS) in bench/ps_many.py.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Benchmark the checkout this script lives in, not whatever actorpy is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _blas_threads(argv: list[str]) -> None:
    """``--blas-threads N`` (default 1), set before numpy loads, here and in every process
    started from here (actorpy's workers, the plain PS's): each of the 2 worker processes
    gets N BLAS threads. With OpenBLAS's default (one per core) a worker that waits at the
    barrier keeps its BLAS threads spinning on the 2 cores while the other's 2-thread
    matrix-vector product waits for its second thread: a 500-sample step measured 1-80 ms
    instead of 0.6 ms (torchrun sets one thread per process for the same reason)."""
    threads = "1"
    for i, arg in enumerate(argv):
        if arg == "--blas-threads" and i + 1 < len(argv):
            threads = argv[i + 1]
        elif arg.startswith("--blas-threads="):
            threads = arg.split("=", 1)[1]
    if threads != "default":
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[name] = threads


_blas_threads(sys.argv[1:])

import cloudpickle  # noqa: E402
import numpy as np  # noqa: E402

import machine  # noqa: E402
import ps_many  # noqa: E402
import ps_problem  # noqa: E402  (bench/ is this script's directory)
from ps_plain import plain_run, single_process  # noqa: E402
from ps_problem import error, gradient, half, straggler_wait, w_star  # noqa: E402

# The callbacks below use the problem on the workers, which cannot import bench/.
cloudpickle.register_pickle_by_value(ps_problem)
cloudpickle.register_pickle_by_value(ps_many)

#: the row suffix of runs whose shard has a worker of its own (--server-node)
ON_SERVER_NODE = ", shard on a server node"


# ------------------------------------------------------------------ actorpy callbacks
class Data:
    def __init__(self, rows: int, features: int) -> None:
        self.rows, self.features = rows, features

    def __call__(self, ctx: Any) -> tuple[np.ndarray, np.ndarray]:
        return half(ctx.seed, ctx.slot, self.rows // 2, self.features)


class Push:
    """Minibatch gradient; slot 1 sleeps twice its compute time when ``straggle``
    (``ps_problem.straggler_wait``, the thread's timer slack set to ``slack_ns``)."""

    def __init__(self, straggle: bool, slack_ns: int = ps_problem.STRAGGLER_SLACK_NS) -> None:
        self.straggle, self.slack_ns = straggle, slack_ns

    def __call__(self, ctx: Any, values: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        x, y = ctx.data
        i = ctx.rng.integers(0, len(y), ctx.batch_size)
        g = gradient(values["w"], x[i], y[i])
        if self.straggle and ctx.slot == 1:
            straggler_wait(t0, self.slack_ns)
        return {"w": g}


class Pull:
    def __init__(self, lr: float) -> None:
        self.lr = np.float32(lr)

    def __call__(self, store: Any, updates: dict[str, Any]) -> None:
        w, _ = store.get("w")
        store.set("w", w - self.lr * updates["w"])


class Target:
    def __init__(self, seed: int, features: int, target: float) -> None:
        self.ws, self.target = w_star(seed, features), target

    def __call__(self, store: Any) -> bool:
        return error(store.get("w")[0], self.ws) < self.target


class RatePush:
    """Returns a fixed update of the model's size (the rate test moves bytes, not math)."""

    def __call__(self, ctx: Any, values: dict[str, Any]) -> dict[str, Any]:
        return {"w": ctx.data}


class RateData:
    def __init__(self, floats: int) -> None:
        self.floats = floats

    def __call__(self, ctx: Any) -> np.ndarray:
        return np.full(self.floats, 1e-6, dtype=np.float32)


class Steps:
    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __call__(self, store: Any) -> bool:
        return store.updates >= self.steps


def actorpy_job_a(cluster: Any, args: argparse.Namespace, barrier: Any, straggle: bool,
                  layout: dict[str, Any] | None = None, balance: bool = False,
                  straggler_factor: float | None = None,
                  straggler_patience: int = 100) -> tuple[float, int, float, int]:
    """Job A on ``cluster``: (seconds to target, updates, final error, workers released as
    stragglers). ``layout``: run()'s ``workers=`` / ``server_nodes=`` (default: every worker
    trains, the shard on worker 1); ``straggler_factor``, ``straggler_patience``: the engine's
    straggler policy."""
    from engines import param

    job = param.Job("bench-a", barrier=barrier, seed=args.seed, data=Data(args.rows, args.features))
    job.register_push(Push(straggle, args.straggler_slack_ns))
    job.register_pull(Pull(args.lr))
    job.register_stop(Target(args.seed, args.features, args.target))
    run = job.start(cluster, init={"w": np.zeros(args.features, dtype=np.float32)},
                    batch=args.batch, balance=balance, timeout_s=args.timeout,
                    straggler_factor=straggler_factor, straggler_patience=straggler_patience,
                    overlap=not getattr(args, "no_overlap", False), **(layout or {}))
    w = run.result()["w"]
    released = sum(status == "RELEASED" for status in run.stats.statuses.values())
    return (run.stats.seconds, run.stats.updates, error(w, w_star(args.seed, args.features)),
            released)


def actorpy_rate(cluster: Any, floats: int, workers: int, steps: int) -> float:
    from actorpy.barrier import ASP
    from engines import param

    job = param.Job("bench-rate", barrier=ASP(), seed=0, data=RateData(floats))
    job.register_push(RatePush())
    job.register_pull(Pull(0.001))
    job.register_stop(Steps(steps))
    run = job.start(cluster, init={"w": np.zeros(floats, dtype=np.float32)},
                    workers=cluster.workers()[:workers], timeout_s=600)
    run.result()
    return run.stats.updates / run.stats.seconds


def startup(repeat: int) -> list[float]:
    import actorpy
    from actorpy.barrier import ASP
    from engines import param

    times = []
    for _ in range(repeat):
        job = param.Job("bench-start", barrier=ASP(), seed=0, data=RateData(16))
        job.register_push(RatePush())
        job.register_pull(Pull(0.001))
        job.register_stop(Steps(10))
        t0 = time.time()
        with actorpy.connect(workers=2) as cluster:
            run = job.start(cluster, init={"w": np.zeros(16, dtype=np.float32)}, timeout_s=60)
            run.result()
            times.append(run.stats.first_push_wall - t0)
    return times


# ------------------------------------------------------------------ report
def _median(rows: list[tuple]) -> tuple:
    """The run with the median time (its own updates and error)."""
    return sorted(rows)[len(rows) // 2]


def _per_update(result: tuple) -> float:
    return result[0] / max(result[1], 1)


def _row(name: str, result: tuple, extra: str = "") -> None:
    seconds, updates, err = result[:3]
    print(f"  {name:<42} {seconds:>8.2f} s {updates:>8d} {1000 * _per_update(result):>9.3f}"
          f" {err:>8.4f}  {extra}", flush=True)


def _release_factor(text: str) -> float | None:
    """``--release-factor``: a finite number > 1 (the engine's straggler_factor), or 0 (None:
    no runs with the straggler policy); checked here, not at the first run that uses it."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value == 0:
        return None
    if not 1 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 1, or 0 for no runs with "
                                         f"the straggler policy; got {text}")
    return value


def straggler_line(args: argparse.Namespace, steps: int = 300) -> str:
    """How much slower the straggler's step is than its compute, measured here: a minibatch
    gradient of Job A's shape, then ``straggler_wait`` (its timer slack as set, and the OS
    default), medians of ``steps``."""
    x, y = half(args.seed, 0, min(args.rows // 2, 20_000), args.features)
    w, rng = np.zeros(args.features, dtype=np.float32), np.random.default_rng(0)
    factors: dict[int, float] = {}
    for slack in dict.fromkeys((args.straggler_slack_ns, 0)):
        ratios = []
        for _ in range(steps):
            t0 = time.perf_counter()
            i = rng.integers(0, len(y), args.batch)
            gradient(w, x[i], y[i])
            t1 = time.perf_counter()
            straggler_wait(t0, slack)
            ratios.append((time.perf_counter() - t0) / (t1 - t0))
        factors[slack] = statistics.median(ratios)
    straggler_wait(time.perf_counter(), 0)   # this thread's slack back to the default
    ps_problem.forget_prctl()   # the module travels by value: a ctypes pointer cannot
    return (f"straggler: its step takes {factors[args.straggler_slack_ns]:.2f}x its compute "
            f"(timer slack {args.straggler_slack_ns} ns), {factors[0]:.2f}x with the OS "
            f"default slack (measured here, medians of {steps})")


def _key(name: str) -> str:
    """A row's name for ``--only``: "pSSP" for "pSSP(1,4)" and "pSSP(1,4), release at 2x"."""
    return name.split("(")[0].split(",")[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--target", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--rate-floats", type=int, default=1_000_000)
    parser.add_argument("--rate-updates", type=int, default=400)
    parser.add_argument("--startup-repeat", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3,
                        help="alternating runs per Job A row (medians are reported)")
    parser.add_argument("--straggler-slack-ns", type=int, default=ps_problem.STRAGGLER_SLACK_NS,
                        help="the straggler's timer slack, so that its sleep ends on time "
                        "(ps_problem.straggler_wait; 0: the OS default, 50 us on Linux)")
    parser.add_argument("--blas-threads", default="1",
                        help="BLAS threads per process, or 'default' for the library's "
                        "own (set before numpy loads; see _blas_threads)")
    parser.add_argument("--only", type=lambda s: s.split(","), default=None,
                        metavar="ROW,...", help="run only these Job A rows (of BSP, ASP, "
                        "pSSP, DSSP, LB-BSP, LB-pSSP, LB-DSSP; BSP and ASP bring their plain "
                        "PS), with and without the straggler, and nothing else; many-keys: "
                        "the many-small-keys rows (bench/ps_many.py)")
    parser.add_argument("--release-factor", type=_release_factor, default=2.0,
                        help="also run pSSP, DSSP and LB-BSP with the engine's straggler "
                        "policy (straggler_factor=, a number > 1; 0: not)")
    parser.add_argument("--release-patience", type=int, default=100,
                        help="the straggler policy's straggler_patience (pushes in a row)")
    parser.add_argument("--no-overlap", action="store_true",
                        help="run the actorpy rows with overlap=False: each step waits for "
                        "its push's reply (by default, under a barrier with staleness, the "
                        "next step computes while the push travels)")
    parser.add_argument("--server-node", action="store_true",
                        help="also run every actorpy Job A row with its shard on a third "
                        "worker that does not train (server_nodes=), alternating with the "
                        "default layout (the shard on training worker 1)")
    args = parser.parse_args(argv)
    watch = machine.CpuWatch()      # the machine's steal and load, printed after each part

    import actorpy
    from actorpy.barrier import ASP, BSP, DSSP, PSP

    barriers = [("BSP", BSP()), ("ASP", ASP()), ("pSSP(1,4)", PSP(sample=1, staleness=4)),
                ("DSSP(1,5)", DSSP(low=1, high=5))]
    print(f"Job A: {args.rows} x {args.features} float32, lr {args.lr}, batch {args.batch} per "
          f"worker, target |w-w*|/|w*| < {args.target}; 2 workers, 1 server; "
          f"{os.cpu_count()} cores; BLAS threads per process: {args.blas_threads}")
    print(straggler_line(args))
    header = f"  {'':<42} {'to target':>10} {'updates':>8} {'ms/update':>9} {'error':>8}"
    # Each barrier's runs with and without the straggler (and the plain PS's) alternate,
    # args.repeat times, and the medians are reported: on a shared machine the load drifts
    # more between two runs a minute apart than a straggler changes a run.
    # (row, barrier, straggler_factor): the plain rows, then (unless --release-factor 0)
    # pSSP, DSSP and LB-BSP with the engine's straggler policy on, which a user with a
    # persistent straggler would turn on (released workers are counted: none should be
    # released without the straggler).
    runs: list[tuple[str, Any, float | None]] = [
        (name, barrier, None) for name, barrier in barriers + [
            ("LB-BSP", BSP()), ("LB-pSSP(1,4)", PSP(sample=1, staleness=4)),
            ("LB-DSSP(1,5)", DSSP(low=1, high=5))]]
    if args.release_factor is not None:
        tag = f", release at {args.release_factor:g}x"
        runs += [(name + tag, barrier, args.release_factor) for name, barrier, _ in runs
                 if _key(name) in ("pSSP", "DSSP", "LB-BSP")]
    if args.only is not None:
        unknown = set(args.only) - {_key(name) for name, _, _ in runs} - {"many-keys"}
        if unknown:
            parser.error(f"--only: unknown row(s) {', '.join(sorted(unknown))}")
        runs = [run for run in runs if _key(run[0]) in args.only]
    results: dict[tuple[str, bool], list[tuple]] = {}
    with actorpy.connect(workers=3 if args.server_node else 2) as cluster:
        # Two workers train. The shard lives on the first of them (the default: that worker
        # talks to it without a socket, and shares its interpreter with the shard answering
        # the other) or, with --server-node, also on a third worker that does not train
        # (server_nodes=: a server process of its own, as the plain PS has); the two layouts
        # alternate in every round.
        nodes = cluster.workers()
        layouts = {"": {"workers": nodes[:2]}}
        if args.server_node:
            layouts[ON_SERVER_NODE] = {"workers": nodes[:2], "server_nodes": nodes[2:]}
        for name, barrier, factor in runs:
            for _ in range(args.repeat):
                for straggle in (False, True):
                    for suffix, layout in layouts.items():
                        results.setdefault((name + suffix, straggle), []).append(actorpy_job_a(
                            cluster, args, barrier, straggle, layout,
                            balance=_key(name).startswith("LB-"), straggler_factor=factor,
                            straggler_patience=args.release_patience))
                    if name in ("BSP", "ASP"):
                        results.setdefault((f"plain {name}", straggle), []).append(
                            plain_run(args, name.lower(), straggle))
        med = {key: _median(rows) for key, rows in results.items()}
        for straggle in ((False, True) if runs else ()):
            print(("\nworker 2 three times slower (sleeps 2x its compute)" if straggle
                   else "\nno straggler") + f"; medians of {args.repeat} alternating runs")
            print(header)
            for name, _, factor in runs:
                for suffix in layouts:
                    result = med[(name + suffix, straggle)]
                    extra = ""
                    if straggle:
                        lost = result[0] / med[(name + suffix, False)][0] - 1
                        extra = f"loses {100 * lost:+.0f} %"
                    if factor is not None:
                        released = sum(r[3] for r in results[(name + suffix, straggle)])
                        extra += (f"{'; ' if extra else ''}workers released: {released} in "
                                  f"{args.repeat} runs")
                    _row(f"actorpy {name}{suffix}", result, extra)
                if name in ("BSP", "ASP"):
                    plain = med[(f"plain {name}", straggle)]
                    ratios = [_per_update(med[(name + suffix, straggle)]) / _per_update(plain)
                              for suffix in layouts]
                    extra = f"actorpy/plain ms per update {ratios[0]:.2f} (target <= 1.3)"
                    if args.server_node:
                        extra += f"; shard on a server node {ratios[1]:.2f}"
                    if straggle:
                        lost = plain[0] / med[(f"plain {name}", False)][0] - 1
                        extra = f"loses {100 * lost:+.0f} %; {extra}"
                    _row(f"plain pyzmq {name}", plain, extra)
            if not straggle and args.only is None:
                _row("single-process SGD", single_process(args))
        print(watch.summary())
        if args.only is None or "many-keys" in args.only:
            ps_many.report(cluster, args.repeat, args.timeout)
        if args.only is not None:
            return 0

        print(f"\npull-compute-push rate, {args.rate_floats} float32 model "
              f"({4 * args.rate_floats / 1e6:.1f} MB each way), ASP")
        for workers in (1, 2):
            rates: list[tuple[float, float]] = []
            for _ in range(args.repeat):   # alternating; the median of each side
                ours = actorpy_rate(cluster, args.rate_floats, workers, args.rate_updates)
                seconds, updates, _ = plain_run(args, "asp", False, workers, args.rate_floats,
                                                max_updates=args.rate_updates)
                rates.append((ours, updates / seconds))
            ours = statistics.median(r[0] for r in rates)
            plain = statistics.median(r[1] for r in rates)
            print(f"  {workers} worker(s): actorpy {ours:8.1f} updates/s   plain pyzmq "
                  f"{plain:8.1f} updates/s   ratio {ours / plain:.2f} (target >= 0.8)", flush=True)
    starts = startup(args.startup_repeat)
    print(f"\nstart-up, connect() + run() to the first push at the server (2 workers): median "
          f"{statistics.median(starts):.2f} s over {len(starts)} (target < 1.5 s)")
    print(watch.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the parameter-server apps (sgd, dnn) share: barrier flags, ``--compare`` specs,
one training run per barrier, and training-curve plots."""
from __future__ import annotations

import argparse
import logging
import math
import os
import secrets
import sys
import time
from typing import Any, Callable, Sequence

from actorpy import apputil
from actorpy.barrier import ASP, BSP, DSSP, PSP, SSP
from actorpy.barrier.plot import check_plot_path
from actorpy.errors import ActorpyError, ConfigError
from engines import param

log = logging.getLogger(__name__)

BARRIERS = ("bsp", "ssp", "asp", "pbsp", "pssp", "dssp")


def add_barrier_arguments(parser: argparse.ArgumentParser) -> None:
    """``--barrier``, ``--staleness``, ``--sample``, ``--high``, ``--compare``."""
    group = parser.add_argument_group("barrier")
    group.add_argument("--barrier", choices=BARRIERS, default="bsp",
                       help="barrier control (default bsp)")
    group.add_argument("--staleness", type=apputil.non_negative_int, default=None,
                       help="s for ssp and pssp; the low bound for dssp (default 4)")
    group.add_argument("--sample", type=apputil.non_negative_int, default=None,
                       help="workers sampled by pbsp and pssp (default 2)")
    group.add_argument("--high", type=apputil.non_negative_int, default=None,
                       help="dssp's high bound (default staleness + 4)")
    group.add_argument("--compare", nargs="+", metavar="SPEC",
                       help="train once per barrier and plot them together: bsp asp ssp:S "
                            "pbsp:B pssp:B:S dssp:LOW:HIGH")


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """``--no-overlap``, ``--checkpoint-dir``, ``--checkpoint-every``, ``--resume``
    (``start_options``)."""
    group = parser.add_argument_group("server")
    group.add_argument("--no-overlap", action="store_true",
                       help="each step waits for its push's reply (default: with a "
                            "staleness, the next step computes while the push travels)")
    group.add_argument("--checkpoint-dir", metavar="DIR", default=None,
                       help="the server shard checkpoints the model and clocks there, so a "
                            "shard whose worker dies restarts from it on another worker "
                            "(with --manager: a directory every worker's host sees)")
    group.add_argument("--checkpoint-every", type=apputil.non_negative_int, default=None,
                       metavar="PULLS", help="pulls between checkpoints (default 100; 0: "
                                             "only at start and end)")
    group.add_argument("--resume", action="store_true",
                       help="go on from the checkpoint in --checkpoint-dir (of a run that "
                            "was stopped or killed, same flags): its model, clocks and step; "
                            "--steps counts from that run's start")
    group.add_argument("--job-name", metavar="NAME", default=None,
                       help="the job's name on the cluster, in its logs and checkpoints "
                            "(default: the app's name plus a random suffix, so that runs "
                            "sharing a cluster do not collide; with --checkpoint-dir, the "
                            "app's name alone, so that --resume finds the checkpoint)")


def start_options(args: argparse.Namespace) -> dict[str, Any]:
    """``Job.start`` keywords from ``add_server_arguments``' flags."""
    every = 100 if args.checkpoint_every is None else args.checkpoint_every
    every = every if args.checkpoint_dir is not None else 0
    return {"overlap": not args.no_overlap, "checkpoint_dir": args.checkpoint_dir,
            "checkpoint_every": every, "resume": args.resume}


def job_name(args: argparse.Namespace, base: str) -> str:
    """The job's name: ``--job-name``, else ``base`` with a random suffix ("sgd-linear-3f9a1c"):
    a job's name is taken on its cluster while it runs, and two runs of one app on one
    cluster (two users, two terminals) must not refuse each other. A run that checkpoints
    keeps ``base`` alone: its checkpoint files are named after the job, and ``--resume``
    (another run) must find them. The suffix is not from the run's seed: it names the run
    and changes nothing it computes."""
    name = getattr(args, "job_name", None)
    if name is not None:
        if not name.strip():
            raise ConfigError("--job-name '': name the job")
        return str(name)
    if getattr(args, "checkpoint_dir", None) is not None:
        return base
    return f"{base}-{secrets.token_hex(3)}"


def check_checkpoint_dir(args: argparse.Namespace) -> None:
    """``--checkpoint-dir`` names a directory (checked here for an embedded cluster; on
    ``--manager`` the shard's host checks its own, at start)."""
    path = getattr(args, "checkpoint_dir", None)
    if path is None:
        if getattr(args, "resume", False):
            raise ConfigError("--resume goes on from a checkpoint: name its --checkpoint-dir")
        if getattr(args, "checkpoint_every", None) is not None:   # before: ignored
            raise ConfigError("--checkpoint-every needs --checkpoint-dir DIR: where to write "
                              "the checkpoints")
        return
    if getattr(args, "resume", False) and getattr(args, "compare", None):
        raise ConfigError("--resume goes on from one run's checkpoint: it takes no --compare")
    if getattr(args, "compare", None):   # before: each run moved the one before it (the
        # user's own checkpoint first) to .earlier, and only the last two were left
        raise ConfigError("--checkpoint-dir keeps one run's checkpoint: it takes no --compare "
                          "(each run would replace the one before)")
    if not path:
        raise ConfigError("--checkpoint-dir '': name a directory")
    if not args.manager and not os.path.isdir(path):
        raise ConfigError(f"--checkpoint-dir {path}: not a directory (create it first)")


#: the apps' learning rates when --lr is not given, before ``default_lr`` scales them
BASE_LR = {"linear": 0.1, "logistic": 1.0}
#: up to this many workers (or peers) whose updates land one at a time, BASE_LR holds
CALM_WORKERS = 4
#: the loss's curvature along x x^T at most: 1 for squared error, 1/4 for log-loss
CURVATURE = {"linear": 1.0, "logistic": 0.25}


def default_lr(model: str, barrier: Any, workers: int, *, averaged: bool,
               features: int | None = None, batch: int | None = None) -> float:
    """``--lr`` when it is not given: ``BASE_LR``, at most half the step at which SGD on
    ``features`` standard normal features with minibatches of ``batch`` diverges, and
    ``CALM_WORKERS`` / N of that with N workers (or peers) whose updates land one at a
    time, each on a w the others changed since it was read: every barrier but a
    synchronous one whose rounds are averaged (``averaged``: the PS engine's BSP; a P2P
    owner folds each push alone). Asynchronous SGD needs a step of about 1 / (its delay)
    and the delay grows with N: at 0.1 the linear problem diverged from 8 workers under
    SSP(4) and from 16 peers under pSSP.

    A minibatch step multiplies the error's mean square by ``1 - 2 lr c + lr^2 c^2 (1 +
    (features + 1) / batch)`` (c: ``CURVATURE``), above 1 from ``lr = 2 batch / (c (batch
    + features + 1))``: at 0.1, ``--features 2000`` (batch 32) went to a loss of 1e29."""
    base = BASE_LR[model]
    if features is not None and batch is not None:
        base = min(base, batch / (CURVATURE[model] * (batch + features + 1)))
    if averaged and isinstance(barrier, SSP) and barrier.staleness == 0:
        return base
    return base * min(1.0, CALM_WORKERS / max(1, workers))


def smallest_batch(args: argparse.Namespace, barrier: Any) -> int:
    """The smallest batch a worker may train on, for the default ``--lr``: with ``--balance``
    under a barrier whose updates land one at a time, a quarter of ``--batch`` (the engines'
    floor; before, the step was chosen for the whole batch and a shrunk one diverged).

    >>> args = argparse.Namespace(balance=True, batch=32)
    >>> smallest_batch(args, SSP(staleness=2)), smallest_batch(args, BSP())
    (8, 32)
    """
    synchronous = isinstance(barrier, SSP) and barrier.staleness == 0
    if getattr(args, "balance", False) and not synchronous:
        return max(1, args.batch // 4)
    return args.batch


def parse_barrier(spec: str) -> Any:
    """A barrier from a ``--compare`` spec.

    >>> parse_barrier("pssp:2:4"), parse_barrier("dssp:1:5")
    (PSP(sample=2, staleness=4), DSSP(low=1, high=5))
    """
    name, *nums = spec.lower().split(":")
    try:
        values = [int(n) for n in nums]
    except ValueError:
        raise ConfigError(f"barrier spec {spec!r}: numbers expected after the name") from None
    arity = {"bsp": 0, "asp": 0, "ssp": 1, "pbsp": 1, "pssp": 2, "dssp": 2}
    if name not in arity or len(values) != arity[name]:
        raise ConfigError(f"barrier spec {spec!r} not understood; use bsp, asp, ssp:S, pbsp:B, "
                          "pssp:B:S or dssp:LOW:HIGH")
    if name == "bsp":
        return BSP()
    if name == "asp":
        return ASP()
    if name == "ssp":
        return SSP(staleness=values[0])
    if name == "pbsp":
        return PSP(sample=values[0], staleness=0)
    if name == "pssp":
        return PSP(sample=values[0], staleness=values[1])
    return DSSP(low=values[0], high=values[1])


#: the barriers each number flag means something to (``barriers_from_args``)
USED_BY = {"--staleness": ("ssp", "pssp", "dssp"), "--sample": ("pbsp", "pssp"),
           "--high": ("dssp",)}


def barriers_from_args(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """``[(label, policy)]``: the ``--compare`` list, or the one ``--barrier``.

    Raises:
        ConfigError: a number flag given that the barrier does not use (it was ignored
            without a word: ``--barrier bsp --staleness 8`` trained under BSP).
    """
    for flag, users in USED_BY.items():
        given = getattr(args, flag[2:], None)
        if given is not None and (args.compare or args.barrier not in users):
            where = ("--compare's specs carry their own numbers (ssp:S, pssp:B:S, ...)"
                     if args.compare else f"--barrier {args.barrier} has none")
            raise ConfigError(f"{flag} applies to {', '.join(users)} only: {where}")
    if args.compare:
        return [(spec, parse_barrier(spec)) for spec in args.compare]
    s = 4 if args.staleness is None else args.staleness
    b = 2 if args.sample is None else args.sample
    high = args.high if args.high is not None else s + 4
    spec = {"bsp": "bsp", "asp": "asp", "ssp": f"ssp:{s}", "pbsp": f"pbsp:{b}",
            "pssp": f"pssp:{b}:{s}", "dssp": f"dssp:{s}:{high}"}[args.barrier]
    return [(spec, parse_barrier(spec))]


#: how long --manager runs wait for a worker to say how much memory it has (a worker busy
#: with another job's tasks answers after them: the check is then skipped)
ASK_MEMORY_S = 5.0


def available_bytes() -> int | None:
    """This machine's available memory (Linux's ``MemAvailable``; None elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_memory(need_bytes: int, what: str) -> None:
    """Refuse a run whose arrays cannot fit in this machine's available memory (Linux's
    ``MemAvailable``; elsewhere nothing is checked): allocations that the kernel overcommits
    fail only as they are filled, as the OOM killer, minutes in.

    Raises:
        ConfigError: ``what`` needs more than is available.
    """
    _check_fits(need_bytes, available_bytes(), what, "here")


def _check_fits(need_bytes: int, available: int | None, what: str, where: str) -> None:
    if available is not None and need_bytes > available:
        raise ConfigError(f"{what} need about {need_bytes / 2**30:.1f} GiB of memory, more than "
                          f"the {available / 2**30:.1f} GiB available {where}")


def check_batch(batch: int, sample_bytes: int, processes: int) -> None:
    """Refuse a ``--batch`` whose minibatches, one per training process on this machine,
    cannot fit in its memory: each step gathers ``batch`` samples of ``sample_bytes``
    (``--batch 10**9`` otherwise ran the cluster until its timeout, its workers stuck
    allocating).

    Raises:
        ConfigError: they need more than is available.
    """
    check_memory(processes * batch * sample_bytes,
                 f"--batch {batch} ({processes} minibatches at once)")


def check_batch_on_workers(cluster: Any, batch: int, sample_bytes: int,
                           peers: int | None = None) -> None:
    """``check_batch`` on an existing cluster (``--manager``), where the minibatches are
    gathered: one worker on each host is asked for that host's available memory. Each
    worker trains once, or with ``peers`` (P2P peers round-robin over the workers) as many
    of them as it may hold: ``ceil(peers / workers)``.

    Raises:
        ConfigError: some host cannot hold the minibatches of its workers.
    """
    hosts: dict[str, list[str]] = {}
    for row in cluster.nodes():
        if row["role"] == "worker" and row["state"] in ("joining", "alive", "suspect"):
            hosts.setdefault(row["host"], []).append(row["node_id"])
    asked = {host: cluster.submit_to(ids[0], available_bytes) for host, ids in hosts.items()}
    each = 1 if peers is None else -(-peers // max(1, sum(map(len, hosts.values()))))
    deadline = time.monotonic() + ASK_MEMORY_S
    for host, fut in asked.items():
        try:
            available = fut.result(max(0.0, deadline - time.monotonic()))
        except ActorpyError as exc:   # busy, or gone: the run itself will tell
            log.info("could not ask %s for its memory: %s", host, exc)
            continue
        n = min(peers or len(hosts[host]), len(hosts[host]) * each)
        _check_fits(n * batch * sample_bytes, available,
                    f"--batch {batch} ({n} minibatches at once)", f"on {host}")


def plot_curves(path: str, runs: Sequence[tuple[str, list[dict[str, float]]]], metric: str,
                label: str, log_scale: bool = True) -> None:
    """Two panels, ``metric`` against seconds and against updates, one line per run."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib (pip install 'actorpy[plot]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, trace in runs:
        rows = [r for r in trace if metric in r]
        for ax, x in zip(axes, ("t", "updates")):
            ax.plot([r[x] for r in rows], [r[metric] for r in rows], label=name)
    for ax, xlabel in zip(axes, ("seconds", "updates")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        if log_scale:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise ConfigError(f"--plot {path}: cannot write it: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


#: the cross-entropy of a uniform guess over 10 classes, ln 10: an untrained network's
CHANCE_LOSS = math.log(10)


def warn_if_diverged(prog: str, name: str, result: dict[str, Any]) -> None:
    """One line on stderr when the run diverged (too large a learning rate, for one): its
    loss is not finite, which ``null`` in the JSON alone would not say, or its weight error
    is above 1, farther from w* than the zeros it started from (a finite 1e26 loss).
    ``prog`` starts it as every other line of the command's does ("actorpy sgd: ...")."""
    value, error = result.get("loss"), result.get("weight_error")
    if isinstance(value, float) and not math.isfinite(value):
        print(f"{prog}: {name}: training diverged (loss is {value}); try a smaller --lr",
              file=sys.stderr)
    elif isinstance(error, float) and error > 1:
        print(f"{prog}: {name}: training diverged (weight error {error:.3g}, farther from w* "
              "than the zeros it started from); try a smaller --lr", file=sys.stderr)
    elif "accuracy" in result and isinstance(value, float) and value > 2 * CHANCE_LOSS:
        # a classifier's cross-entropy; before: a loss of 569677 went without a word
        print(f"{prog}: {name}: training diverged (loss {value:.3g}, where a uniform guess "
              f"over the 10 digits scores {CHANCE_LOSS:.2f}); try a smaller --lr",
              file=sys.stderr)


def in_cli_words(exc: ActorpyError) -> None:
    """Word a PS engine error for the command line (``cli_message``): its flags, not the
    API's parameters. The engine says what happened (``job_timeout``, ``shard_lost``,
    ``checkpoint_missing``, ``name_taken``); it knows nothing of the apps' flags."""
    if exc.cli_message is not None:
        return
    timeout = getattr(exc, "job_timeout", None)
    lost = getattr(exc, "shard_lost", None)
    path = getattr(exc, "checkpoint_missing", None)
    taken = getattr(exc, "name_taken", None)
    if taken is not None:     # the apps name their runs apart unless told a name (--job-name)
        exc.cli_message = (f"a job named {taken!r} is already running on this cluster (another "
                           "run of this command there?); wait for it to end, or give this run "
                           "its own --job-name")
    elif timeout is not None:   # an app has no stop function of the user's to check
        name, limit, where = timeout
        exc.cli_message = (f"job {name!r} did not finish within --timeout {limit:g} s{where}; "
                           "raise --timeout (or lower --steps)")
    elif lost is not None:
        exc.cli_message = (f"{lost}; pass --checkpoint-dir DIR (on every worker's host) to "
                           "survive this")
    elif path is not None:    # the apps have no --servers to resume with
        exc.cli_message = (f"no checkpoint at {path}; run once without --resume (with "
                           "--checkpoint-dir) to create one")


def run_barriers(args: argparse.Namespace,
                 train: Callable[[Any, argparse.Namespace, Any], tuple[dict[str, Any], list]],
                 describe: Callable[[dict[str, Any]], str], metric: str, label: str, *,
                 prog: str, log_scale: bool = True,
                 check_cluster: Callable[[Any], None] | None = None) -> int:
    """Train once per barrier the flags name, on the cluster they name: a line per run
    (``describe(result)``), or with ``--json`` the result (``{"runs": [...]}`` with
    ``--compare``); with ``--plot`` the curves of ``metric``. ``check_cluster(cluster)``
    runs once connected, before any training; ``prog`` ("actorpy sgd") starts a line on
    stderr. Returns the exit status."""
    barriers = barriers_from_args(args)  # bad specs fail before a cluster starts
    if getattr(args, "balance", False):   # not after the runs before it trained
        for name, barrier in barriers:
            if not param.balances(barrier):
                raise ConfigError(f"--balance resizes batches so that the workers' steps "
                                  f"keep pace; every run needs a barrier that holds fast "
                                  f"workers for slow ones (bsp, ssp, pbsp, pssp, dssp), not "
                                  f"{name}")
    check_plot_path(args.plot)
    check_checkpoint_dir(args)
    runs = []
    with apputil.connect_from_args(args) as cluster:
        if check_cluster is not None:
            check_cluster(cluster)
        for name, barrier in barriers:
            try:
                result, trace = train(cluster, args, barrier)
            except ActorpyError as exc:
                in_cli_words(exc)
                raise
            runs.append((name, result, trace))
            warn_if_diverged(prog, name, result)
            if not args.json:
                print(f"{name:<12} {describe(result)}  updates {result['updates']}  "
                      f"{result['seconds']:.2f} s  steps per worker "
                      f"{result['steps_per_worker']}", flush=True)
    if args.json:
        if args.compare:
            apputil.print_json({"runs": [{"barrier": name, **res} for name, res, _ in runs]})
        else:
            apputil.print_json(runs[0][1])
    if args.plot:   # after the results: a plot that cannot be written does not lose them
        plot_curves(args.plot, [(name, trace) for name, _, trace in runs], metric, label,
                    log_scale=log_scale)
    return 0

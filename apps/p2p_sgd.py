"""``actorpy p2p-sgd``: the SGD app's regression trained with no server, by peers on a
Kademlia overlay (``engines.peer``); the model lives on the overlay (each key on its
``replication`` closest peers) and the barrier samples peers through it.

    actorpy p2p-sgd --peers 4 --barrier pssp --sample 2 --staleness 4 --json
    actorpy p2p-sgd --peers 8 --barrier bsp --model logistic --plot curves.png
    actorpy p2p-sgd --bootstrap tcp://10.0.0.4:7400 --secret-file cluster.secret --json

With ``--bootstrap`` it trains on every standalone peer (``actorpy peer``) of that overlay,
one training peer each, with no manager anywhere; ``--peers`` is then their number.

The problem is ``actorpy sgd``'s (same data generation, w*, loss and gradient); each peer
generates its own ``rows / peers`` rows. With ``--json`` stdout holds only ``{"loss",
"weight_error", "steps_per_worker", "updates", "seconds"}`` with the same meanings as
``actorpy sgd``: held-out loss and ``|w - w*| / |w*|`` of the model read from the overlay,
steps each peer completed, pushes folded into w, seconds of training.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

from actorpy import apputil
from actorpy.errors import ActorpyTimeout, ConfigError
# Pull is the PS app's: an owner's store has the same get/set as the server's.
from apps.sgd import (Pull, data_bytes, generate, gradient, loss, quiet, sample_bytes,
                      true_weights)
from apps.training import (barriers_from_args, check_batch, check_batch_on_workers,
                           check_memory, check_plot_path, default_lr, plot_curves,
                           smallest_batch, warn_if_diverged)
from engines import peer
from engines.peer.overlay_run import OverlayClient, OverlayRun

BARRIERS = ("pbsp", "pssp", "asp", "bsp", "ssp")

#: Each peer is a service with its own threads and sockets: 256 on each of 2 workers did
#: not finish 20 steps in 120 s on a 2-core machine, and 50,000 a worker left the workers
#: stuck past the driver's exit. 64 a worker (docs/peer.md's largest runs hold 4) is a
#: generous bound an embedded cluster can check; MAX_PEERS bounds any cluster.
MAX_PEERS_PER_WORKER = 64
MAX_PEERS = 4096


class PeerData:
    """``data(index)``: peer ``index``'s share of the rows, made on that peer."""

    def __init__(self, seed: int, rows: int, peers: int, features: int, model: str) -> None:
        self.seed, self.rows, self.peers = seed, rows, peers
        self.features, self.model = features, model

    def __call__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        w = true_weights(self.seed, self.features, self.model)
        rng = np.random.default_rng([self.seed, 31, index])
        return generate(rng, max(1, self.rows // self.peers), w, self.model)


class Push:
    """Each peer's gradient step; with a ``target`` it also remembers how far the w it last
    read is from w* (known to this generated problem), for ``StopAfter``."""

    def __init__(self, model: str, w_star: np.ndarray | None = None) -> None:
        self.model, self.w_star = model, w_star
        self.error = float("inf")

    @quiet
    def __call__(self, ctx: peer.PeerContext, values: dict[str, Any]) -> dict[str, Any]:
        x, y = ctx.data
        if self.w_star is not None:
            self.error = float(np.linalg.norm(values["w"] - self.w_star)
                               / np.linalg.norm(self.w_star))
        i = ctx.rng.integers(0, len(y), ctx.batch_size)
        return {"w": gradient(values["w"], x[i], y[i], self.model)}


class StopAfter:
    """After ``steps`` steps, or once the w this peer last read is within ``target``
    (``push`` is the same peer's ``Push``: shipped together, they stay one object)."""

    def __init__(self, steps: int, push: Push | None = None,
                 target: float | None = None) -> None:
        self.steps, self.push, self.target = steps, push, target

    def __call__(self, ctx: peer.PeerContext) -> bool:
        if ctx.step >= self.steps:
            return True
        return (self.target is not None and self.push is not None
                and self.push.error < self.target)


class Trace:
    """The driver's monitor: every ``every_s`` reads w from the overlay and records the
    held-out loss and weight error (for ``--plot``)."""

    def __init__(self, seed: int, features: int, model: str, every_s: float) -> None:
        self.model, self.every_s = model, every_s
        self.w_star = true_weights(seed, features, model)
        self.x, self.y = generate(np.random.default_rng([seed, 104729]), 2000, self.w_star,
                                  model)
        self.rows: list[dict[str, float]] = []
        self._next = 0.0

    @quiet
    def __call__(self, run: Any, seconds: float) -> None:
        if seconds < self._next:
            return
        self._next = seconds + self.every_s
        got = run.read("w")
        if got is not None:
            w = got[0]
            self.rows.append({"t": seconds, "updates": run.updates(),
                              "loss": loss(w, self.x, self.y, self.model),
                              "weight_error": float(np.linalg.norm(w - self.w_star)
                                                    / np.linalg.norm(self.w_star))})


@quiet
def train(cluster: Any, args: argparse.Namespace, barrier: Any,
          on_poll: Callable[[Any, float], None] | None = None,
          members: list[Any] | None = None) -> tuple[dict[str, Any], list]:
    """One training run: the JSON fields and the trace (``on_poll``: see ``Job.run``).
    ``cluster`` is a cluster, or an ``OverlayClient`` of standalone peers (``members``:
    its ``members()``, when already asked)."""
    job = peer.Job(f"p2p-sgd-{args.model}", barrier=barrier, replication=args.replication,
                   seed=args.seed, rpc_timeout_s=args.rpc_timeout, batch=args.batch,
                   balance=args.balance, overlap=args.overlap, durable=args.durable)
    job.register_schedule(lambda ctx: ["w"])
    w_star = true_weights(args.seed, args.features, args.model)
    push = Push(args.model, w_star if args.target is not None else None)
    job.register_push(push)
    if members is None and isinstance(cluster, OverlayClient):
        members = cluster.members()
    peers = args.peers if members is None else len(members)
    lr = args.lr if args.lr is not None else default_lr(
        args.model, barrier, peers, averaged=False, features=args.features,
        batch=smallest_batch(args, barrier))
    job.register_pull(Pull(lr, args.decay))
    job.register_stop(StopAfter(args.steps, push, args.target))
    trace = Trace(args.seed, args.features, args.model, 0.2) if args.plot else None

    def poll(run: Any, seconds: float) -> None:
        if trace is not None:
            trace(run, seconds)
        if on_poll is not None:
            on_poll(run, seconds)
    init = {"w": np.zeros(args.features, dtype=np.float32)}
    if members is not None:
        run = OverlayRun(job, cluster, members, init,
                         data=PeerData(args.seed, args.rows, len(members), args.features,
                                       args.model), timeout_s=args.timeout, on_poll=poll)
        result = run.run()
    else:
        result = job.run(cluster, peers=args.peers, init=init,
                         data=PeerData(args.seed, args.rows, args.peers, args.features,
                                       args.model), timeout_s=args.timeout, on_poll=poll)
    w = result.model["w"]
    x, y = generate(np.random.default_rng([args.seed, 1299709]), 5000, w_star, args.model)
    out = {"loss": loss(w, x, y, args.model),
           "weight_error": float(np.linalg.norm(w - w_star) / np.linalg.norm(w_star)),
           # the folds in w's final version (its clock): a push folded into a branch that
           # was dropped when w's owner changed, and pushed again, counts once (the owners'
           # ``result.updates`` counted it twice: 104 for 2 peers' 100 pushes, once)
           "steps_per_worker": list(result.steps.values()), "updates": result.clocks["w"],
           "seconds": result.seconds}
    return out, trace.rows if trace is not None else []


PROG = "actorpy p2p-sgd"


def warn_if_short(label: str, result: dict[str, Any]) -> None:
    """One line on stderr when w holds fewer updates than the peers completed steps (each
    step pushes once to w): a killed peer's last ones, or pushes lost when live peers took
    each other for dead (a host too busy for --rpc-timeout: docs/peer.md). Before, the
    JSON's ``updates`` alone said it (105 of 200 at --rpc-timeout 0.001), with exit 0."""
    steps = sum(result["steps_per_worker"])
    if result["updates"] < steps:
        print(f"{PROG}: {label}: w holds {result['updates']} updates of {steps} completed "
              f"steps: {steps - result['updates']} were lost (a peer killed, or peers that took "
              "each other for dead: raise --rpc-timeout)", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG,
                                     description=apputil.summary(__doc__))
    parser.add_argument("--peers", type=int, help="peers (default 4); several per worker "
                        "when there are more peers than workers (with --bootstrap: every "
                        "peer of the overlay)")
    parser.add_argument("--model", choices=("linear", "logistic"), default="linear")
    group = parser.add_argument_group("barrier")
    group.add_argument("--barrier", choices=BARRIERS, default="pssp", help="default pssp")
    group.add_argument("--staleness", type=apputil.non_negative_int, default=None,
                       help="s for ssp, pssp (default 4)")
    group.add_argument("--sample", type=apputil.non_negative_int, default=None,
                       help="peers sampled by pbsp and pssp (default 2)")
    parser.add_argument("--steps", type=int, default=300, help="steps per peer (default 300)")
    parser.add_argument("--lr", type=apputil.positive_float, default=None,
                        help="learning rate (default 0.1 linear, 1.0 logistic, lower with "
                             "many --features: at most BATCH / (BATCH + FEATURES + 1), 4x "
                             "that for logistic; with more than 4 peers, 4/N of that: each "
                             "owner folds every push alone)")
    parser.add_argument("--decay", type=apputil.positive_float, default=None,
                        help="lr / sqrt(1 + updates of w / DECAY) (default: none for linear, "
                             "100 for logistic)")
    parser.add_argument("--batch", type=int, default=32, help="minibatch per peer (default 32)")
    parser.add_argument("--balance", action="store_true",
                        help="a peer the others wait on takes fewer samples (down to a "
                             "quarter of --batch); ssp and pssp only")
    parser.add_argument("--overlap", type=apputil.non_negative_int, default=1,
                        help="steps that may compute while a push travels (default 1; at "
                             "most the staleness; 0: each step waits for its answers)")
    parser.add_argument("--replication", type=int, default=3,
                        help="peers holding each key (default 3)")
    parser.add_argument("--no-durable", dest="durable", action="store_false",
                        help="acknowledge a push once the key's owner applied it, and send "
                             "the write to the key's other holders within 10 ms: with more "
                             "than 2 peers no replication round on each answer's way, but a "
                             "push acknowledged in those 10 ms dies with a killed owner (the "
                             "key never does)")
    parser.add_argument("--rpc-timeout", type=apputil.positive_float, default=0.5,
                        help="overlay RPC timeout in seconds (default 0.5)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the data, w* and every peer's batches (default 0)")
    parser.add_argument("--rows", type=int, default=20_000, help="rows in all (default 20000)")
    parser.add_argument("--features", type=int, default=100, help="default 100")
    parser.add_argument("--target", type=apputil.positive_float, default=None,
                        help="a peer stops early once the w it last read has a weight error "
                             "below this")
    parser.add_argument("--timeout", type=apputil.positive_float, default=600.0,
                        help="seconds (default 600)")
    parser.add_argument("--plot", metavar="FILE", help="save the training curves (png)")
    apputil.add_cluster_arguments(parser, default_workers=2)
    parser.add_argument("--bootstrap", metavar="tcp://HOST:PORT",
                        type=apputil.given("an address"),
                        help="train on the standalone peers (`actorpy peer`) of the overlay "
                             "this peer belongs to, all of them (with --secret-file)")
    return parser


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.bootstrap and args.peers is not None:   # it trained on all of them regardless
        raise ConfigError("--bootstrap trains on every standalone peer of the overlay: it "
                          "takes no --peers (start or stop `actorpy peer` processes instead)")
    if args.peers is None:
        args.peers = 4
    if args.decay is None and args.model == "logistic":
        args.decay = 100.0
    if min(args.peers, args.steps, args.batch, args.rows, args.features) < 1:
        raise ConfigError("--peers, --steps, --batch, --rows and --features must be >= 1")
    if args.bootstrap and (args.manager or args.workers is not None):
        raise ConfigError("--bootstrap trains on standalone peers: it takes no --manager "
                          "or --workers")
    if args.replication < 1:
        raise ConfigError("--replication must be >= 1: the peers holding each key")
    workers = 0 if args.bootstrap else apputil.embedded_workers(args)
    held = MAX_PEERS_PER_WORKER * workers
    if workers > 0 and held < MAX_PEERS and args.peers > held:
        raise ConfigError(f"--peers {args.peers} is more than the {held} that {workers} workers "
                          f"hold ({MAX_PEERS_PER_WORKER} each); add --workers")
    if args.peers > MAX_PEERS:
        raise ConfigError(f"--peers {args.peers} is more than {MAX_PEERS}")
    # the training rows are made on the workers: here only with an embedded cluster
    check_memory(data_bytes(0 if args.manager or args.bootstrap else args.rows, args.features),
                 "--rows and --features")
    check_batch(args.batch, sample_bytes(args.features), args.peers if workers > 0 else 0)
    args.compare, args.high = None, None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    [(label, barrier)] = barriers_from_args(args)
    if args.balance and peer.balance_bound(barrier) is None:
        raise ConfigError(f"--balance needs a barrier with a staleness of 1 or more (ssp, "
                          f"pssp with --staleness >= 1), not {label}")
    if args.overlap > peer.MAX_OVERLAP:
        raise ConfigError(f"--overlap {args.overlap} is more than {peer.MAX_OVERLAP}")
    check_plot_path(args.plot)
    with (OverlayClient(args.bootstrap, secret_file=args.secret_file) if args.bootstrap
          else apputil.connect_from_args(args, task_threads=2)) as cluster:
        if args.manager:   # its workers' machines, once connected, as `actorpy sgd` does
            if not cluster.workers():   # else "add some (cluster.add_workers)", exit 1
                raise ConfigError("the cluster has no live workers to train on; start some "
                                  "with `actorpy worker --manager ...`")
            check_batch_on_workers(cluster, args.batch, sample_bytes(args.features),
                                   peers=args.peers)
        # asked first: a --bootstrap where no peer answers is said as such, not as a run
        # past its --timeout (it was, 10 s into a --timeout of 600 s)
        members = cluster.members() if args.bootstrap else None
        try:
            result, trace = train(cluster, args, barrier, members=members)
        except ActorpyTimeout as exc:   # the engine's words name its timeout_s=
            exc.cli_message = (f"training did not finish within --timeout {args.timeout:g} "
                               "s; raise --timeout (or lower --steps or --peers)")
            raise
    warn_if_diverged(PROG, label, result)
    warn_if_short(label, result)
    if args.json:
        apputil.print_json(result)
    else:
        print(f"{label} on {len(result['steps_per_worker'])} peers: loss {result['loss']:.4g}  "
              f"weight error {result['weight_error']:.4f}  updates {result['updates']}  "
              f"{result['seconds']:.2f} s  steps per peer {result['steps_per_worker']}",
              file=sys.stdout)
    if args.plot:   # after the results: a plot that cannot be written does not lose them
        plot_curves(args.plot, [(label, trace)], "loss", "held-out loss")
    return 0


def demo() -> None:
    """`actorpy demo`: P2P SGD on 4 peers, no server."""
    import actorpy

    print("\npeer-to-peer: linear regression on 4 peers over a Kademlia overlay, no server")
    args = parse(["--peers", "4", "--steps", "150", "--barrier", "pssp"])
    started = time.monotonic()
    with actorpy.connect(workers=2, task_threads=2) as cluster:
        result, _ = train(cluster, args, barriers_from_args(args)[0][1])
    print(f"  pssp:2:4 weight error {result['weight_error']:.4f}  {result['updates']} updates "
          f"in {result['seconds']:.2f} s ({time.monotonic() - started:.1f} s in all)  "
          f"steps per peer {result['steps_per_worker']}")
    print("  (try `actorpy p2p-sgd --peers 8 --barrier bsp`)")


if __name__ == "__main__":
    from apps import run_as_command

    raise SystemExit(run_as_command("p2p-sgd"))

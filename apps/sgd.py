"""``actorpy sgd``: linear or logistic regression by SGD through the parameter server, on
generated data with known weights w*.

    actorpy sgd --model linear --workers 4 --barrier pssp --sample 2 --staleness 4 --json
    actorpy sgd --compare bsp ssp:4 pssp:2:4 asp --plot curves.png

Each worker generates its own rows (``--rows`` in all, float32) where it trains; the server
folds the gradients into w (``w -= lr * mean gradient``) and records the loss and
``weight_error = |w - w*| / |w*|`` as training goes. With ``--json`` stdout holds only
``{"loss", "weight_error", "steps_per_worker", "updates", "seconds"}`` (with ``--compare``,
``{"runs": [...]}`` with one such object per barrier, plus its ``barrier``).
"""
from __future__ import annotations

import argparse
from typing import Any, Sequence

import numpy as np

from actorpy import apputil
from actorpy.errors import ConfigError
from apps.training import (add_barrier_arguments, add_server_arguments, barriers_from_args,
                           check_batch, check_batch_on_workers, check_memory, default_lr,
                           job_name, run_barriers, smallest_batch, start_options)
from engines import param

NOISE = 0.1


#: held-out rows: the server's monitor (``Monitor``, shipped to it) and the final score
HELD_OUT_ROWS = 2000 + 5000


def data_bytes(rows: int, features: int) -> int:
    """Memory a run's float32 arrays take on the driver's machine: ``rows`` training rows
    (all of them with an embedded cluster), the held-out rows and the monitor's copy on its
    way to the server (``p2p-sgd`` holds fewer: an upper bound)."""
    return (rows + HELD_OUT_ROWS + 2000) * (features + 1) * 4


def sample_bytes(features: int) -> int:
    """Memory one sample of a minibatch takes in a step: its float32 row, target, ``x.w``
    and residual, and its int64 index."""
    return (features + 3) * 4 + 8


def true_weights(seed: int, features: int, model: str) -> np.ndarray:
    w = np.random.default_rng([seed, 7919]).standard_normal(features).astype(np.float32)
    return w if model == "linear" else w * np.float32(2.0 / np.sqrt(features))


def generate(rng: np.random.Generator, rows: int, w: np.ndarray,
             model: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``x ~ N(0, I)`` and targets from ``w`` (linear: ``x.w + noise``; logistic:
    Bernoulli(sigmoid(x.w)) labels)."""
    x = rng.standard_normal((rows, len(w)), dtype=np.float32)
    z = x @ w
    if model == "linear":
        return x, z + np.float32(NOISE) * rng.standard_normal(rows, dtype=np.float32)
    return x, (rng.random(rows, dtype=np.float32) < 1 / (1 + np.exp(-z))).astype(np.float32)


#: a diverged run is reported once (``warn_if_diverged``), not by numpy at every step
quiet = np.errstate(over="ignore", invalid="ignore")


@quiet
def loss(w: np.ndarray, x: np.ndarray, y: np.ndarray, model: str) -> float:
    """Mean squared error (linear) or mean log-loss (logistic)."""
    z = x @ w
    if model == "linear":
        return float(np.mean((z - y) ** 2))
    return float(np.mean(np.logaddexp(0, z) - y * z))


@quiet
def gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray, model: str) -> np.ndarray:
    z = x @ w
    residual = z - y if model == "linear" else 1 / (1 + np.exp(-z)) - y
    return (x.T @ residual) * np.float32(1.0 / len(y))


class Data:
    """``data=``: this worker's share of the rows, made on the worker."""

    def __init__(self, rows: int, features: int, model: str) -> None:
        self.rows, self.features, self.model = rows, features, model

    def __call__(self, ctx: param.DataContext) -> tuple[np.ndarray, np.ndarray]:
        w = true_weights(ctx.seed, self.features, self.model)
        return generate(ctx.rng, max(1, self.rows // ctx.slots), w, self.model)


class Push:
    def __init__(self, model: str) -> None:
        self.model = model

    def __call__(self, ctx: param.WorkerContext, values: dict[str, Any]) -> dict[str, Any]:
        x, y = ctx.data
        i = ctx.rng.integers(0, len(y), ctx.batch_size)
        return {"w": gradient(values["w"], x[i], y[i], self.model)}


class Pull:
    """``w -= lr_t * g`` with ``lr_t = lr / sqrt(1 + clock / decay)`` (constant without a
    decay); ``clock`` is w's own clock: the times the server has set it."""

    def __init__(self, lr: float, decay: float | None = None) -> None:
        self.lr, self.decay = lr, decay

    @quiet
    def __call__(self, store: param.Store, updates: dict[str, Any]) -> None:
        w, clock = store.get("w")
        lr = self.lr if not self.decay else self.lr / np.sqrt(1.0 + clock / self.decay)
        store.set("w", w - np.float32(lr) * updates["w"])


class Monitor:
    """The stop condition; records loss and weight error every ``every`` pulls (on a
    held-out sample shipped with it) and stops after ``steps`` steps or at ``target``."""

    def __init__(self, seed: int, features: int, model: str, steps: int,
                 target: float | None, every: int) -> None:
        self.model, self.steps, self.target, self.every = model, steps, target, every
        self.w_star = true_weights(seed, features, model)
        self.x, self.y = generate(np.random.default_rng([seed, 104729]), 2000, self.w_star,
                                  model)
        self._pulls = 0

    @quiet
    def __call__(self, store: param.Store) -> bool:
        w, _ = store.get("w")
        error = float(np.linalg.norm(w - self.w_star) / np.linalg.norm(self.w_star))
        done = store.step >= self.steps or (self.target is not None and error < self.target)
        if self._pulls % self.every == 0 or done:
            store.record(loss=loss(w, self.x, self.y, self.model), weight_error=error)
        self._pulls += 1
        return done


@quiet
def train(cluster: Any, args: argparse.Namespace, barrier: Any) -> tuple[dict[str, Any], list]:
    """One training run; the JSON fields and the trace."""
    job = param.Job(job_name(args, f"sgd-{args.model}"), barrier=barrier, seed=args.seed,
                    data=Data(args.rows, args.features, args.model))
    job.register_push(Push(args.model))
    lr = args.lr if args.lr is not None else default_lr(
        args.model, barrier, len(cluster.workers()), averaged=True, features=args.features,
        batch=smallest_batch(args, barrier))
    job.register_pull(Pull(lr, args.decay))
    job.register_stop(Monitor(args.seed, args.features, args.model, args.steps, args.target,
                              max(1, args.steps // 100)))
    run = job.start(cluster, init={"w": np.zeros(args.features, dtype=np.float32)},
                    balance=args.balance, batch=args.batch, timeout_s=args.timeout,
                    **start_options(args))
    w = run.result()["w"]
    w_star = true_weights(args.seed, args.features, args.model)
    x, y = generate(np.random.default_rng([args.seed, 1299709]), 5000, w_star, args.model)
    stats = run.stats
    result = {"loss": loss(w, x, y, args.model),
              "weight_error": float(np.linalg.norm(w - w_star) / np.linalg.norm(w_star)),
              "steps_per_worker": stats.steps_per_worker, "updates": stats.updates,
              "seconds": stats.seconds}
    return result, stats.trace


PROG = "actorpy sgd"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG,
                                     description=apputil.summary(__doc__))
    parser.add_argument("--model", choices=("linear", "logistic"), default="linear")
    add_barrier_arguments(parser)
    add_server_arguments(parser)
    parser.add_argument("--steps", type=int, default=500,
                        help="steps of the slowest worker (default 500; under asp, ssp and "
                             "psp faster workers run on meanwhile)")
    parser.add_argument("--lr", type=apputil.positive_float, default=None,
                        help="learning rate (default 0.1 linear, 1.0 logistic, lower with "
                             "many --features: at most BATCH / (BATCH + FEATURES + 1), 4x "
                             "that for logistic; with more than 4 workers, 4/N of that under "
                             "any barrier but bsp)")
    parser.add_argument("--decay", type=apputil.positive_float, default=None,
                        help="lr / sqrt(1 + updates of w / DECAY) (default: none for linear, "
                             "100 for logistic)")
    parser.add_argument("--batch", type=int, default=32, help="minibatch per worker (default 32)")
    parser.add_argument("--balance", action="store_true",
                        help="resize each worker's batch from its measured step times so that "
                             "all keep pace (LB-BSP under bsp; also ssp, pbsp, pssp, dssp)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the data, w* and every worker's batches (default 0)")
    parser.add_argument("--rows", type=int, default=20_000, help="rows in all (default 20000)")
    parser.add_argument("--features", type=int, default=100, help="default 100")
    parser.add_argument("--target", type=apputil.positive_float, default=None,
                        help="stop early once weight_error is below this")
    parser.add_argument("--timeout", type=apputil.positive_float, default=600.0,
                        help="seconds (default 600)")
    parser.add_argument("--plot", metavar="FILE", help="save the training curves (png)")
    apputil.add_cluster_arguments(parser, default_workers=2)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.decay is None and args.model == "logistic":
        args.decay = 100.0
    if min(args.steps, args.batch, args.rows, args.features) < 1:
        raise ConfigError("--steps, --batch, --rows and --features must be >= 1")
    # the training rows are made on the workers: here only with an embedded cluster
    check_memory(data_bytes(0 if args.manager else args.rows, args.features),
                 "--rows and --features")
    check_batch(args.batch, sample_bytes(args.features), apputil.embedded_workers(args))

    def on_workers(cluster: Any) -> None:   # --manager: their machines, once connected
        check_batch_on_workers(cluster, args.batch, sample_bytes(args.features))
    return run_barriers(args, train, lambda r: f"loss {r['loss']:.4g}  weight error "
                                               f"{r['weight_error']:.4f}", "loss", "held-out loss",
                        prog=PROG, check_cluster=on_workers if args.manager else None)

def demo() -> None:
    """`actorpy demo`: the same regression under three barriers."""
    import actorpy

    print("\nparameter server: linear regression, 2 workers, 100 features, 300 steps "
          "(the slower worker's; under ASP the faster one takes more)")
    args = build_parser().parse_args(["--steps", "300", "--rows", "20000"])
    args.lr, args.decay = 0.1, None
    with actorpy.connect(workers=2) as cluster:
        for label, barrier in barriers_from_args(
                build_parser().parse_args(["--compare", "bsp", "ssp:4", "asp"])):
            result, _ = train(cluster, args, barrier)
            print(f"  {label:<6} weight error {result['weight_error']:.4f}  "
                  f"{result['updates']} updates in {result['seconds']:.2f} s  "
                  f"steps per worker {result['steps_per_worker']}")
    print("  (try `actorpy sgd --compare bsp ssp:4 pssp:2:4 asp --plot sgd.png`)")


if __name__ == "__main__":
    from apps import run_as_command

    raise SystemExit(run_as_command("sgd"))

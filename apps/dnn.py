"""``actorpy dnn``: a small torch MLP or CNN trained through the parameter server, on
scikit-learn's bundled 8x8 digits (no download) or, with ``--data DIR``, on MNIST idx files.

    actorpy dnn --workers 2 --barrier ssp --staleness 2 --steps 600 --json
    actorpy dnn --model cnn --device cuda --steps 300
    actorpy dnn --compare bsp ssp:4 asp --plot dnn.png

Every parameter tensor is a key; each worker loads its share of the training set where it
trains (on ``--device``: the CPU, or its GPU) and pushes gradients; the server applies SGD on
the CPU and records the test accuracy as it goes.
``--json`` prints ``{"accuracy", "loss", "steps_per_worker", "updates", "seconds"}`` (with
``--compare``: ``{"runs": [...]}``).
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import math
import os
import zlib
from typing import Any, Sequence

import numpy as np

from actorpy import apputil
from actorpy.errors import ConfigError
from apps.training import (add_barrier_arguments, add_server_arguments, check_memory,
                           job_name, run_barriers, start_options)
from engines import param

MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def read_idx(path: str) -> np.ndarray:
    """An idx file (MNIST's format; ``.gz`` too) as a numpy array.

    Raises:
        ConfigError: it cannot be read, or is not a whole idx file of unsigned bytes.
    """
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as exc:  # a directory, a cut or foreign .gz
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ConfigError(f"{path} is not an idx file of unsigned bytes")
    ndim = raw[3]
    if ndim == 0 or len(raw) < 4 + 4 * ndim:
        raise ConfigError(f"{path} is not an idx file of unsigned bytes: its header says "
                          f"{ndim} dimensions in {len(raw)} bytes")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    shown = str(shape) if ndim <= 4 else f"of {ndim} dimensions {shape[:4]}..."
    if data.size < math.prod(shape):
        raise ConfigError(f"{path} is truncated: {data.size} values for shape {shown}")
    if data.size > math.prod(shape):
        raise ConfigError(f"{path} holds {data.size} values, more than its header's shape "
                          f"{shown} takes ({math.prod(shape)}): not a whole idx file")
    try:
        return data.reshape(shape)
    except ValueError:   # no values, and dimensions whose product numpy cannot index
        raise ConfigError(f"{path} is not an idx file numpy can hold: shape {shown}") from None


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits (1797 images), read from the file it ships (what
    ``sklearn.datasets.load_digits`` reads, without importing scikit-learn: seconds saved
    on every worker)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the digits data set comes with scikit-learn: pip install "
                          "'actorpy[apps]', or pass --data DIR with MNIST idx files")
    path = os.path.join(list(spec.submodule_search_locations)[0], "datasets", "data",
                        "digits.csv.gz")
    table = np.loadtxt(path, delimiter=",")
    return table[:, :-1], table[:, -1].astype(np.int64)


def load(split: str, data_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
    """``(x float32 in [0, 1], y int64)`` of the train or test split."""
    if data_dir is None:
        x, y = digits()
        order = np.random.default_rng(0).permutation(len(y))
        cut = int(0.8 * len(order))
        idx = order[:cut] if split == "train" else order[cut:]
        return (x[idx] / 16.0).astype(np.float32), y[idx]
    images, labels = read_mnist(split, data_dir)
    return (images.reshape(len(images), -1).astype(np.float32) / 255.0,
            labels.astype(np.int64))


def read_mnist(split: str, data_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """The images and labels of one split of ``data_dir``, as stored (unsigned bytes).

    Raises:
        ConfigError: a file is missing or bad, or images and labels do not pair up.
    """
    if not os.path.isdir(data_dir):
        what = "not a directory" if os.path.exists(data_dir) else "no such directory"
        raise ConfigError(f"--data {data_dir}: {what}; name the directory that holds the "
                          "MNIST idx files")
    paths = []
    for name in MNIST_FILES[split]:
        found = [os.path.join(data_dir, name + ext) for ext in ("", ".gz")
                 if os.path.exists(os.path.join(data_dir, name + ext))]
        if not found:
            raise ConfigError(f"--data {data_dir}: {name}[.gz] is missing")
        if not os.path.isfile(found[0]):   # a FIFO's read waits for ever, /dev/zero's fills
            raise ConfigError(f"--data {data_dir}: {os.path.basename(found[0])} is not a "
                              "regular file (a pipe, a device, a directory)")
        paths.append(found[0])
    images, labels = read_idx(paths[0]), read_idx(paths[1])
    # what would fail on every worker in torch's words (or train on a wrong pairing)
    if images.ndim < 2 or labels.ndim != 1 or len(images) != len(labels):
        raise ConfigError(f"--data {data_dir}: {os.path.basename(paths[0])} holds images of "
                          f"shape {images.shape} and {os.path.basename(paths[1])} labels of "
                          f"shape {labels.shape}: need N images and N labels")
    if images.size == 0:   # none, or of no pixels: reshaping them fails in numpy's words
        raise ConfigError(f"--data {data_dir}: {os.path.basename(paths[0])} holds no pixels "
                          f"(images of shape {images.shape}); nothing to train or test on")
    if labels.size and labels.max() > 9:
        raise ConfigError(f"--data {data_dir}: {os.path.basename(paths[1])} holds label "
                          f"{labels.max()}; the networks here tell the digits 0-9 apart")
    return images, labels


def check_data(data_dir: str | None, kind: str) -> int:
    """Fail on a ``--data`` the workers could not train on, before anything starts; the
    pixels of its images.

    Raises:
        ConfigError: a file is missing or bad, the splits' images differ in size, or the
            cnn's images are not square or smaller than 2x2.
    """
    if data_dir is None:
        train = test = digits()[0].shape[1]
    else:  # as stored: a quarter of the memory of the training set as floats
        train, test = (math.prod(read_mnist(split, data_dir)[0].shape[1:])
                       for split in ("train", "test"))
    if train != test:
        raise ConfigError(f"--data {data_dir}: training images have {train} pixels, test "
                          f"images {test}; both splits need images of one size")
    if kind == "cnn" and math.isqrt(test) ** 2 != test:
        raise ConfigError(f"--model cnn needs square images, and {test} pixels are not a "
                          "square; use --model mlp")
    side = math.isqrt(test)
    if kind == "cnn" and side < 2:   # its pooling halves the side: 1x1 left nothing (torch's
        # "Output size is too small", on every worker, after the run had started)
        raise ConfigError(f"--model cnn needs images of at least 2x2 pixels (its 2x2 max "
                          f"pooling), and these are {side}x{side}; use --model mlp")
    return test


def worker_bytes(pixels: int, hidden: int, kind: str, batch: int) -> int:
    """About the memory a worker's step takes: per sample its float32 image and the
    network's activations, each twice (forward, and the gradient), and its index; and four
    copies of the parameters (the model, its gradients, the values pulled, those pushed)."""
    side = math.isqrt(pixels)
    if kind == "mlp":
        activations = 2 * hidden + 10
        parameters = (pixels + 1) * hidden + (hidden + 1) * 10
    else:
        activations = 16 * side * side + (16 + 2 * hidden) * (side // 2) ** 2 + 10
        parameters = 16 * 10 + (16 * 9 + 1) * hidden + (hidden * (side // 2) ** 2 + 1) * 10
    return batch * (2 * 4 * (pixels + activations) + 8) + 4 * 4 * parameters


def make_model(inputs: int, hidden: int, kind: str = "mlp") -> Any:
    """``mlp``: one hidden layer of ``hidden`` units; ``cnn``: over the square image, a 3x3
    convolution (16 channels), 2x2 max pooling, a 3x3 convolution (``hidden`` channels),
    a linear layer."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    side = math.isqrt(inputs)
    return nn.Sequential(nn.Unflatten(1, (1, side, side)),
                         nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, hidden, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(hidden * (side // 2) ** 2, 10))


class Local:
    """A worker's share of the data and its copy of the network (made on the worker, on
    ``device``)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, hidden: int, kind: str,
                 device: str) -> None:
        import torch

        self.device = torch.device(device)
        self.x = torch.from_numpy(x).to(self.device)
        self.y = torch.from_numpy(y).to(self.device)
        self.model = make_model(x.shape[1], hidden, kind).to(self.device)


class Data:
    def __init__(self, data_dir: str | None, hidden: int, kind: str = "mlp",
                 device: str = "cpu") -> None:
        self.data_dir, self.hidden, self.kind, self.device = data_dir, hidden, kind, device

    def __call__(self, ctx: param.DataContext) -> Local:
        import torch

        torch.set_num_threads(1)   # one process per core already
        device = self.device
        if device == "cuda":
            check_device(device)
            device = f"cuda:{ctx.slot % torch.cuda.device_count()}"   # a worker per GPU
        x, y = load("train", self.data_dir)
        # every slot-th image from this worker's slot; with fewer images than workers (a
        # tiny --data), one of them each (before: none, and the first step failed)
        part = ctx.slot % ctx.slots
        rows = np.arange(part, max(len(y), ctx.slots), ctx.slots) % len(y)
        return Local(x[rows], y[rows], self.hidden, self.kind, device)


def check_device(device: str) -> None:
    """A clear error for a ``--device`` this machine does not have."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: torch sees no CUDA GPU here "
                              f"(torch {torch.__version__}); use --device cpu")


def push(ctx: param.WorkerContext, values: dict[str, Any]) -> dict[str, Any]:
    import torch

    local: Local = ctx.data
    with torch.no_grad():
        for name, p in local.model.named_parameters():
            p.copy_(values[name])           # host to device when on a GPU
    i = torch.from_numpy(ctx.rng.integers(0, len(local.y), ctx.batch_size)).to(local.device)
    local.model.zero_grad()
    torch.nn.functional.cross_entropy(local.model(local.x[i]), local.y[i]).backward()
    # the server keeps the model on the CPU: gradients go back to host memory
    return {name: p.grad.detach().to("cpu", copy=True)
            for name, p in local.model.named_parameters()}


class Pull:
    def __init__(self, lr: float) -> None:
        self.lr = lr

    def __call__(self, store: param.Store, updates: dict[str, Any]) -> None:
        for name, grad in updates.items():
            value, _ = store.get(name)
            store.set(name, value - self.lr * grad)


def evaluate(values: dict[str, Any], x: np.ndarray, y: np.ndarray,
             hidden: int, kind: str = "mlp") -> tuple[float, float]:
    """``(accuracy, mean cross-entropy)`` of the parameters ``values`` on ``(x, y)``."""
    import torch

    model = make_model(x.shape[1], hidden, kind)
    model.load_state_dict(values)
    with torch.no_grad():
        out = model(torch.from_numpy(x))
        target = torch.from_numpy(y)
        return (float((out.argmax(1) == target).float().mean()),
                float(torch.nn.functional.cross_entropy(out, target)))


class Monitor:
    """Stop after ``steps`` steps (or at ``target`` accuracy); records the test accuracy
    every ``every`` pulls."""

    def __init__(self, data_dir: str | None, hidden: int, kind: str, steps: int,
                 target: float | None, every: int) -> None:
        self.x, self.y = load("test", data_dir)
        self.hidden, self.kind = hidden, kind
        self.steps, self.target, self.every = steps, target, every
        self._pulls = 0

    def __call__(self, store: param.Store) -> bool:
        done = store.step >= self.steps
        if self._pulls % self.every == 0 or done or self.target is not None:
            values = {k: store.get(k)[0] for k in store.keys()}
            accuracy, loss = evaluate(values, self.x, self.y, self.hidden, self.kind)
            store.record(accuracy=accuracy, loss=loss)
            done = done or (self.target is not None and accuracy >= self.target)
        self._pulls += 1
        return done


def train(cluster: Any, args: argparse.Namespace, barrier: Any) -> tuple[dict[str, Any], list]:
    x_test, y_test = load("test", args.data)
    model = make_model(x_test.shape[1], args.hidden, args.model)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    job = param.Job(job_name(args, "dnn"), barrier=barrier, seed=args.seed,
                    data=Data(args.data, args.hidden, args.model, args.device))
    job.register_push(push)
    job.register_pull(Pull(args.lr))
    job.register_stop(Monitor(args.data, args.hidden, args.model, args.steps, args.target,
                              max(1, args.steps // 50)))
    run = job.start(cluster, init=init, batch=args.batch, balance=args.balance,
                    timeout_s=args.timeout, **start_options(args))
    values = run.result()
    accuracy, loss = evaluate(values, x_test, y_test, args.hidden, args.model)
    stats = run.stats
    return ({"accuracy": accuracy, "loss": loss, "steps_per_worker": stats.steps_per_worker,
             "updates": stats.updates, "seconds": stats.seconds}, stats.trace)


PROG = "actorpy dnn"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG,
                                     description=apputil.summary(__doc__))
    parser.add_argument("--data", metavar="DIR",
                        help="MNIST idx files (train-images-idx3-ubyte[.gz] ...); default: "
                             "scikit-learn's bundled 8x8 digits")
    add_barrier_arguments(parser)
    add_server_arguments(parser)
    parser.add_argument("--steps", type=int, default=600,
                        help="steps of the slowest worker (default 600; under asp, ssp and "
                             "psp faster workers run on meanwhile)")
    parser.add_argument("--lr", type=apputil.positive_float, default=0.1, help="default 0.1")
    parser.add_argument("--batch", type=int, default=32, help="default 32")
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                        help="mlp (default) or cnn (two 3x3 convolutions)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where workers compute (cuda: worker i on GPU i %% count; "
                             "the server stays on the CPU)")
    parser.add_argument("--hidden", type=int, default=64,
                        help="hidden units, or the cnn's second layer channels (default 64)")
    parser.add_argument("--balance", action="store_true",
                        help="balanced batch sizes (LB-BSP under bsp; also ssp, pbsp, pssp, "
                             "dssp)")
    parser.add_argument("--target", type=float, default=None,
                        help="stop early at this test accuracy")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds every worker's batches (default 0)")
    parser.add_argument("--timeout", type=apputil.positive_float, default=600.0,
                        help="seconds the training may take (default 600)")
    parser.add_argument("--plot", metavar="FILE", help="save accuracy curves (png)")
    apputil.add_cluster_arguments(parser, default_workers=2)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.steps, args.batch, args.hidden) < 1:
        raise ConfigError("--steps, --batch and --hidden must be >= 1")
    if args.target is not None and not 0 < args.target <= 1:   # NaN too: never reached
        raise ConfigError(f"--target is a test accuracy in (0, 1], got {args.target}")
    pixels = check_data(args.data, args.model)   # fail on a bad --data before starting anything
    workers = apputil.embedded_workers(args)
    check_memory(workers * worker_bytes(pixels, args.hidden, args.model, args.batch),
                 f"--batch {args.batch} and --hidden {args.hidden} ({workers} workers)")
    if args.manager is None:
        check_device(args.device)     # (on a cluster, each worker checks its own)
    return run_barriers(args, train, lambda r: f"test accuracy {r['accuracy']:.3f}  loss "
                                               f"{r['loss']:.3f}", "accuracy", "test accuracy",
                        prog=PROG, log_scale=False)


if __name__ == "__main__":
    from apps import run_as_command

    raise SystemExit(run_as_command("dnn"))

"""Training problems shared by the engine tests (importable on workers)."""
from __future__ import annotations

from typing import Any

import numpy as np

from actorpy.barrier import weighted_average

D = 8
ROWS = 800


def w_star(seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 12345]).standard_normal(D)


def linear_data(ctx: Any) -> tuple[np.ndarray, np.ndarray]:
    x = ctx.rng.standard_normal((ROWS, D))
    return x, x @ w_star(ctx.seed) + 0.01 * ctx.rng.standard_normal(ROWS)


def gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return x.T @ (x @ w - y) / len(y)


def linear_push(ctx: Any, values: dict[str, Any]) -> dict[str, Any]:
    x, y = ctx.data
    i = ctx.rng.integers(0, len(y), ctx.batch_size)
    return {"w": gradient(values["w"], x[i], y[i])}


def split_push(ctx: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The same model as four keys of two coordinates each."""
    x, y = ctx.data
    i = ctx.rng.integers(0, len(y), ctx.batch_size)
    w = np.concatenate([values[f"w{k}"] for k in range(4)])
    g = gradient(w, x[i], y[i])
    return {f"w{k}": g[2 * k: 2 * k + 2] for k in range(4)}


class SGDPull:
    """``w -= lr * update`` for every key (a class, so it pickles by reference)."""

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def __call__(self, store: Any, updates: dict[str, Any]) -> None:
        for key, update in updates.items():
            value, _ = store.get(key)
            store.set(key, value - self.lr * update)


class StepStop:
    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __call__(self, store: Any) -> bool:
        return store.step >= self.steps


class ErrorStop:
    """Stop once ``||w - w*|| / ||w*|| < target``."""

    def __init__(self, seed: int, target: float) -> None:
        self.w, self.target = w_star(seed), target

    def __call__(self, store: Any) -> bool:
        w, _ = store.get("w")
        return float(np.linalg.norm(w - self.w) / np.linalg.norm(self.w)) < self.target


def weight_error(w: np.ndarray, seed: int) -> float:
    ws = w_star(seed)
    return float(np.linalg.norm(w - ws) / np.linalg.norm(ws))


def reference_sgd(seed: int, slots: int, steps: int, batch: int, lr: float) -> np.ndarray:
    """Single-process minibatch SGD with the workers' data and draws: each step averages
    the slots' gradients (equal batches), in slot order, as BSP's aggregate does."""

    class Ctx:
        def __init__(self, slot: int) -> None:
            self.seed, self.slot = seed, slot
            self.rng = np.random.default_rng([seed, slot, 1])

    data = [linear_data(Ctx(s)) for s in range(slots)]
    rngs = [np.random.default_rng([seed, s]) for s in range(slots)]
    w = np.zeros(D)
    for _ in range(steps):
        grads = []
        for (x, y), rng in zip(data, rngs):
            i = rng.integers(0, len(y), batch)
            grads.append(gradient(w, x[i], y[i]))
        w = w - lr * weighted_average(grads, [batch] * slots)
    return w


class SlowErrorStop(ErrorStop):
    """ErrorStop, but not before ``min_step`` steps (keeps a job alive long enough for a
    test to kill or add a process mid-run)."""

    def __init__(self, seed: int, target: float, min_step: int) -> None:
        super().__init__(seed, target)
        self.min_step = min_step

    def __call__(self, store: Any) -> bool:
        return store.step >= self.min_step and super().__call__(store)


class JoinStop:
    """Stop ``steps`` steps after a ``workers``-th worker took part."""

    def __init__(self, workers: int, steps: int) -> None:
        self.workers, self.steps = workers, steps
        self.since: int | None = None

    def __call__(self, store: Any) -> bool:
        if self.since is None and store.worker_num() >= self.workers:
            self.since = store.step
        return self.since is not None and store.step >= self.since + self.steps

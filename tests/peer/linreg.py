"""The simulated P2P jobs the peer tests share: linear regression with a known w*, its
weights split over several keys (so over several owners), and helpers to run and check it."""
from __future__ import annotations

import numpy as np

from actorpy.barrier import Decision, Policy
from engines.peer import Job, OwnerStore, PeerContext, SimRun

D, KEYS, ROWS, BATCH = 16, 4, 400, 32
W_STAR = np.random.default_rng(0).normal(size=D)
CHUNKS = np.array_split(np.arange(D), KEYS)
NAMES = [f"w{i}" for i in range(KEYS)]


def shard(index: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 + index)
    x = rng.normal(size=(ROWS, D))
    return x, x @ W_STAR + 0.01 * rng.normal(size=ROWS)


def linreg(barrier: Policy, steps: int, lr: float = 0.05, seed: int = 3) -> Job:
    """Linear regression with its weights split over 4 keys (so over several owners)."""
    job = Job("linreg", barrier=barrier, seed=seed)

    @job.register_schedule
    def schedule(ctx: PeerContext) -> list[str]:
        return NAMES

    @job.register_push
    def push(ctx: PeerContext, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x, y = ctx.data
        w = np.concatenate([values[n] for n in NAMES])
        rows = ctx.rng.integers(0, ROWS, BATCH)
        grad = x[rows].T @ (x[rows] @ w - y[rows]) / BATCH
        return {n: grad[c] for n, c in zip(NAMES, CHUNKS)}

    @job.register_pull
    def pull(store: OwnerStore, updates: dict[str, np.ndarray]) -> None:
        for name, grad in updates.items():
            w, _clock = store.get(name)
            store.set(name, w - lr * grad)

    job.register_stop(lambda ctx: ctx.step >= steps)
    return job


class FailingPolicy:
    """A custom barrier policy whose ``decide`` raises."""

    def decide(self, me_step: int, view: object) -> Decision:
        raise ZeroDivisionError("no view")


class AnswerPolicy:
    """A custom barrier policy whose ``decide`` answers ``answer`` (not a Decision)."""

    def __init__(self, answer: object) -> None:
        self.answer = answer

    def decide(self, me_step: int, view: object) -> object:
        return self.answer


def init() -> dict[str, np.ndarray]:
    return {n: np.zeros(len(c)) for n, c in zip(NAMES, CHUNKS)}


def weight_error(model: dict[str, np.ndarray]) -> float:
    w = np.concatenate([model[n] for n in NAMES])
    return float(np.linalg.norm(w - W_STAR) / np.linalg.norm(W_STAR))


def record_folds(job: Job) -> dict[tuple[str, str], list[int]]:
    """Wrap ``job``'s pull to record each fold on an owner: (key, pusher) -> the pusher's
    steps, in the order the owner folded them (not a pusher's private folds of its own)."""
    folded: dict[tuple[str, str], list[int]] = {}
    pull = job.spec({}).pull

    @job.register_pull
    def recording(store: OwnerStore, updates: dict[str, np.ndarray]) -> None:
        for name in updates:
            if not store.private:
                folded.setdefault((name, store.sender), []).append(store.sender_step)
        pull(store, updates)
    return folded


def run(job: Job, peers: int = 8, **options: object) -> tuple[SimRun, object]:
    sim = SimRun(job, peers, init(), data=shard, **options)  # type: ignore[arg-type]
    return sim, sim.run()

"""Job A's problem, the same for every side of the PS benchmark (actorpy, plain pyzmq,
single process; bench/peer.py's P2P rows too): linear regression with a known w*, each of
two workers holding half of the rows, and its gradient and error. Pure numpy.

bench/ps.py registers this module to be pickled by value, as its callbacks use it on the
workers (which cannot import bench/).
"""
from __future__ import annotations

import numpy as np

NOISE = 0.1


def w_star(seed: int, features: int) -> np.ndarray:
    return np.random.default_rng([seed, 7]).standard_normal(features).astype(np.float32)


def half(seed: int, slot: int, rows: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows worker ``slot`` holds (the same for actorpy and plain pyzmq)."""
    rng = np.random.default_rng([seed, slot, 1])
    x = rng.standard_normal((rows, features), dtype=np.float32)
    y = x @ w_star(seed, features) + np.float32(NOISE) * rng.standard_normal(rows, dtype=np.float32)
    return x, y


def gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (x.T @ (x @ w - y)) * np.float32(1.0 / len(y))


def error(w: np.ndarray, ws: np.ndarray) -> float:
    return float(np.linalg.norm(w - ws) / np.linalg.norm(ws))

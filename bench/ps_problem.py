"""Job A's problem, the same for every side of the PS benchmark (actorpy, plain pyzmq,
single process; bench/peer.py's P2P rows too): linear regression with a known w*, each of
two workers holding half of the rows, and its gradient and error. Pure numpy.

bench/ps.py registers this module to be pickled by value, as its callbacks use it on the
workers (which cannot import bench/).
"""
from __future__ import annotations

import ctypes
import time

import numpy as np

NOISE = 0.1
#: the straggler thread's timer slack (``--straggler-slack-ns``; Linux's default is 50 us)
STRAGGLER_SLACK_NS = 1
_PR_SET_TIMERSLACK = 29
_prctl: list = []


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


def forget_prctl() -> None:
    """Drop the cached ``prctl`` (a ctypes pointer: this module is pickled by value)."""
    _prctl.clear()


def straggler_wait(t0: float, slack_ns: int = STRAGGLER_SLACK_NS) -> None:
    """The straggler's wait: twice its compute since ``t0``, so that its step takes 3x.

    A sleep ends when the thread's timer slack allows: with Linux's default 50 us, a 0.45 ms
    sleep woke ~75 us late here (a 3.3x straggler, not 3x), with 1 ns ~25 us late (the
    machine's own wake-up). So the calling thread's slack is set to ``slack_ns`` first (0:
    the thread's default; nothing where prctl is missing)."""
    spent = time.perf_counter() - t0
    if not _prctl:
        try:
            _prctl.append(ctypes.CDLL(None, use_errno=True).prctl)
        except (OSError, AttributeError):
            _prctl.append(None)
    if _prctl[0] is not None:
        _prctl[0](_PR_SET_TIMERSLACK, ctypes.c_ulong(slack_ns), 0, 0, 0)
    time.sleep(2 * spent)

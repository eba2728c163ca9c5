"""Per-iteration times for simulated workers: a distribution plus straggler models.

Times are drawn up front into a (workers x steps) matrix from an injected numpy rng, and the
matrix grows by doubling, so worker ``w``'s ``k``-th iteration always takes the same time
whichever simulator engine (or policy) consumes it: runs differ only by the barrier.
"""
from __future__ import annotations

import math

from dataclasses import dataclass

import numpy as np

from actorpy.errors import ConfigError

DISTRIBUTIONS = ("exp", "gamma", "lognormal", "const")


@dataclass(frozen=True)
class Workload:
    """How long iterations take.

    Attributes:
        dist: "exp" (default), "gamma", "lognormal" or "const".
        mean_s: mean seconds per iteration of a normal worker.
        shape: gamma shape k, or lognormal sigma (ignored by exp and const).
        straggler_frac: fraction of workers that are persistently slower.
        straggler_slowdown: how many times slower those workers are.
        transient_prob: chance that any one iteration is a transient straggle.
        transient_slowdown: how many times slower a transient straggle is.

    >>> Workload(dist="const", mean_s=2.0).matrix(np.random.default_rng(0), 2, 3).tolist()
    [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]
    """

    dist: str = "exp"
    mean_s: float = 1.0
    shape: float = 2.0
    straggler_frac: float = 0.0
    straggler_slowdown: float = 1.0
    transient_prob: float = 0.0
    transient_slowdown: float = 1.0

    def __post_init__(self) -> None:
        if self.dist not in DISTRIBUTIONS:
            raise ConfigError(f"--dist must be one of {', '.join(DISTRIBUTIONS)}, "
                              f"got {self.dist!r}")
        if not self.mean_s > 0 or not self.shape > 0:
            raise ConfigError(f"--mean and shape must be > 0, got {self.mean_s}, {self.shape}")
        if not 0.0 <= self.straggler_frac <= 1.0 or not 0.0 <= self.transient_prob <= 1.0:
            raise ConfigError("--straggler-frac and transient probability must lie in [0, 1]")
        if self.straggler_slowdown < 1.0 or self.transient_slowdown < 1.0:
            raise ConfigError("slowdowns must be >= 1 (a straggler is slower, not faster)")
        if not all(math.isfinite(v) for v in (self.mean_s, self.shape, self.straggler_slowdown,
                                               self.transient_slowdown)):
            raise ConfigError("--mean, --shape and slowdowns must be finite numbers")

    def base(self, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
        """Draw i.i.d. times of a normal worker."""
        m = self.mean_s
        if self.dist == "exp":
            return rng.exponential(m, shape)
        if self.dist == "gamma":
            return rng.gamma(self.shape, m / self.shape, shape)
        if self.dist == "lognormal":
            sigma = self.shape
            return rng.lognormal(np.log(m) - sigma * sigma / 2, sigma, shape)
        return np.full(shape, m)

    def stragglers(self, rng: np.random.Generator, workers: int) -> np.ndarray:
        """Indices of the persistently slow workers (drawn once per run)."""
        count = int(round(self.straggler_frac * workers))
        return np.sort(rng.choice(workers, size=count, replace=False)) if count else np.arange(0)

    def matrix(self, rng: np.random.Generator, workers: int, steps: int,
               slow: np.ndarray | None = None) -> np.ndarray:
        """A (workers x steps) block of iteration times, stragglers applied."""
        times = self.base(rng, (workers, steps))
        if self.transient_prob > 0:
            hit = rng.random((workers, steps)) < self.transient_prob
            times = np.where(hit, times * self.transient_slowdown, times)
        if slow is not None and len(slow):
            times[slow] *= self.straggler_slowdown
        return times


class Durations:
    """Worker ``w``'s ``k``-th iteration time, drawn lazily in doubling blocks.

    Args:
        workload: the model.
        workers: P.
        expected_steps: a guess of the most steps any worker will take (grows if short).
        rng: numpy Generator; consumed in a fixed order, so results depend only on the seed.
    """

    def __init__(self, workload: Workload, workers: int, expected_steps: int,
                 rng: np.random.Generator) -> None:
        self._workload = workload
        self._rng = rng
        self.slow = workload.stragglers(rng, workers)
        self._workers = workers
        self.array = workload.matrix(rng, workers, max(8, expected_steps), self.slow)
        self.rows: list[list[float]] = self.array.tolist()

    def grow(self) -> None:
        """Double the number of drawn steps."""
        extra = self._workload.matrix(self._rng, self._workers, self.array.shape[1], self.slow)
        self.array = np.concatenate([self.array, extra], axis=1)
        self.rows = self.array.tolist()

    def at(self, worker: int, step: int) -> float:
        """Seconds that ``worker`` needs for its iteration number ``step`` (0-based)."""
        while step >= self.array.shape[1]:
            self.grow()
        return self.rows[worker][step]

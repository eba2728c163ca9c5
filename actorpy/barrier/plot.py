"""CDF plots of per-worker steps, like the Owl book's step-progress figures.

matplotlib is imported only when a plot is drawn (``pip install actorpy[plot]``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from actorpy.barrier.sim import SimResult
from actorpy.errors import ConfigError


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError("plotting needs matplotlib: pip install 'actorpy[plot]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def step_cdf(per_worker: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of steps: sorted steps and the fraction of workers at or below.

    >>> xs, ys = step_cdf([3, 1, 2, 2])
    >>> xs.tolist(), ys.tolist()
    ([1, 2, 2, 3], [0.25, 0.5, 0.75, 1.0])
    """
    xs = np.sort(np.asarray(per_worker))
    return xs, np.arange(1, len(xs) + 1) / len(xs)


def plot_cdf(results: Sequence[SimResult], path: str, labels: Sequence[str] | None = None,
             title: str | None = None) -> None:
    """Draw one CDF curve per result into a small PNG at ``path``.

    Args:
        results: simulations to compare (e.g. several barriers, or a β sweep).
        path: output file (PNG).
        labels: legend entries; default the barrier names.
        title: figure title; default describes the first result's config.
    """
    if not results:
        raise ConfigError("nothing to plot")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=80)
    try:
        for i, result in enumerate(results):
            xs, ys = step_cdf(result.per_worker)
            label = labels[i] if labels else result.barrier
            ax.step(xs, ys, where="post", label=label)
        cfg = results[0].config
        ax.set_xlabel("steps completed")
        ax.set_ylabel("fraction of workers (CDF)")
        ax.set_title(title or f"{cfg.workers} workers, {cfg.seconds:g} simulated s, "
                     f"{cfg.workload.dist} mean {cfg.workload.mean_s:g} s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)

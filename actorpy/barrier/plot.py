"""CDF plots of per-worker steps, like the Owl book's step-progress figures.

matplotlib is imported only when a plot is drawn (``pip install actorpy[plot]``).
"""
from __future__ import annotations

import os
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


def check_plot_path(path: str | None) -> None:
    """Refuse a ``--plot FILE`` that cannot be written before training, not after: its
    directory does not exist, it is a directory or a device, or matplotlib writes no such
    format; or it is empty (``--plot "$UNSET"``: no plot, and no word of it).

    Raises:
        ConfigError: which of those, and what to pass instead.
    """
    if path == "":
        raise ConfigError("--plot needs a file name, such as curves.png")
    if path is not None:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ConfigError(f"--plot {path}: there is no directory {folder}")
        if os.path.isdir(path):   # matplotlib would write PATH.png beside it
            raise ConfigError(f"--plot {path} is a directory; name a file in it, such as "
                              f"{os.path.join(path, 'curves.png')}")
        if os.path.exists(path) and not os.path.isfile(path):
            # a FIFO failed after training ("not seekable"); /dev/full had it written to
            # /dev/full.png, a file in /dev
            raise ConfigError(f"--plot {path} is not a regular file (a pipe, a device); "
                              "name a file, such as curves.png")
        suffix = os.path.splitext(path)[1][1:].lower()
        if suffix and suffix not in _plot_formats():
            raise ConfigError(f"--plot {path}: matplotlib writes no .{suffix} files; use "
                              f"one of {', '.join(sorted(_plot_formats()))}")
        _check_writable(path)


def _check_writable(path: str) -> None:
    """Open ``path`` for writing as the plot will (a read-only file system, a directory
    this user may not write to), leaving it as it was: created, then removed at once (the
    file a link names, not the link)."""
    target = os.path.realpath(path)
    existed = os.path.exists(target)
    try:
        os.close(os.open(target, os.O_WRONLY | os.O_APPEND | (0 if existed else
                                                              os.O_CREAT | os.O_EXCL)))
    except OSError as exc:
        raise ConfigError(f"--plot {path}: cannot write it: {exc.strerror or exc}") from None
    if not existed:
        os.remove(target)


def plot_file(path: str) -> str:
    """The file that matplotlib writes for ``path``: ``path`` itself, or with no suffix
    ``path`` with its default format's (png) added, as ``savefig`` does.

    >>> plot_file("steps.png"), plot_file("out/steps")
    ('steps.png', 'out/steps.png')
    """
    if os.path.splitext(path)[1][1:]:
        return path
    import matplotlib

    return f"{path.rstrip('.')}.{matplotlib.rcParams['savefig.format']}"


def _plot_formats() -> set[str]:
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise ConfigError("--plot needs matplotlib (pip install 'actorpy[plot]')") from None
    return set(FigureCanvasBase.get_supported_filetypes())


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

"""Progress bars for long actions (tqdm, on stderr): stage i/n, partitions done/total, and
rows and MB per second. Shown only when stderr is a terminal, unless asked for.

Precedence, as for every setting: ``progress=`` argument > ``ACTORPY_PROGRESS`` (``0`` turns
bars off) > on when stderr is a terminal.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Mapping


def wanted(flag: bool | None, env: Mapping[str, str] | None = None,
           stream: Any = None) -> bool:
    """Whether to draw bars.

    >>> wanted(False), wanted(True), wanted(None, {"ACTORPY_PROGRESS": "0"})
    (False, True, False)
    """
    if flag is not None:
        return bool(flag)
    env = os.environ if env is None else env
    if env.get("ACTORPY_PROGRESS", "").strip() in ("0", "false", "no", "off"):
        return False
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """One action's bar, reset at each stage. Does nothing when disabled.

    Args:
        action: e.g. "collect".
        enabled: from ``wanted``.
        stages: how many stages the action is expected to run (grows on recomputation).
        delay_s: a stage shorter than this draws nothing (no flicker for quick actions).
    """

    def __init__(self, action: str, enabled: bool, stages: int, delay_s: float = 0.5) -> None:
        self.action = action
        self.delay_s = delay_s
        self.enabled = enabled
        self.stages = stages
        self.index = 0
        self._bar: Any = None
        self._t0 = time.monotonic()
        self._rows = 0
        self._bytes = 0

    def stage(self, name: str, tasks: int) -> None:
        """A stage with ``tasks`` partitions starts."""
        self.index += 1
        self.stages = max(self.stages, self.index)
        if not self.enabled:
            return
        from tqdm import tqdm

        if self._bar is not None:
            self._bar.close()
        self._t0 = time.monotonic()
        self._rows = self._bytes = 0
        self._bar = tqdm(total=tasks, file=sys.stderr, unit="part", leave=False, delay=self.delay_s,
                         desc=f"{self.action} stage {self.index}/{self.stages} {name}"[:60])

    def advance(self, rows: int, nbytes: int) -> None:
        """A partition finished, having read ``rows`` items and ``nbytes`` of input."""
        if self._bar is None:
            return
        self._rows += rows
        self._bytes += nbytes
        rate = max(time.monotonic() - self._t0, 1e-6)
        post = f"{self._rows / rate:,.0f} rows/s"
        if self._bytes:
            post += f", {self._bytes / rate / 1e6:,.1f} MB/s"
        self._bar.set_postfix_str(post, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

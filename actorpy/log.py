"""Logging helpers. The library never installs handlers; only the CLI configures logging."""
from __future__ import annotations

import logging
import os


def configure(level: str | None = None) -> None:
    """Configure the root logger for a CLI process (the only caller). ``level`` beats
    ``ACTORPY_LOG_LEVEL``, which beats WARNING."""
    chosen = (level or os.environ.get("ACTORPY_LOG_LEVEL") or "WARNING").upper()
    if not isinstance(logging.getLevelName(chosen), int):
        chosen = "WARNING"
    logging.basicConfig(
        level=chosen,
        format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s",
    )


class Throttle:
    """Let a repeated warning through at most once per ``interval_s`` per key, counting the
    ones held back (a misconfigured peer retrying every 100 ms must not flood the log).

    >>> t = Throttle(10.0)
    >>> t.allow("k", now=0.0), t.allow("k", now=1.0), t.allow("k", now=11.0)
    ((True, 0), (False, 0), (True, 1))
    """

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._last: dict[object, float] = {}
        self._held: dict[object, int] = {}

    def allow(self, key: object, now: float | None = None) -> tuple[bool, int]:
        """Whether to log now, and how many were held back since the last one logged."""
        import time

        now = time.monotonic() if now is None else now
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False, 0
        self._last[key] = now
        return True, self._held.pop(key, 0)

"""Logging helpers. The library never installs handlers; only the CLI configures logging."""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import OrderedDict

from actorpy.errors import ConfigError

#: the log levels the CLI's ``--log-level`` and ``connect(log_level=...)`` take
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def env_level() -> str | None:
    """``ACTORPY_LOG_LEVEL``, upper-cased, or None where it is unset or empty.

    Raises:
        ConfigError: it is set to something else than one of :data:`LEVELS` (before, it was
            taken as WARNING, unsaid: ``ACTORPY_LOG_LEVEL=verbose`` logged nothing more).
    """
    value = os.environ.get("ACTORPY_LOG_LEVEL", "").strip()
    if not value:
        return None
    if value.upper() not in LEVELS:
        raise ConfigError("ACTORPY_LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or "
                          f"CRITICAL, got {value!r}")
    return value.upper()


def configure(level: str | None = None) -> None:
    """Configure the root logger for a CLI process (the only caller, which has checked
    ``level``). ``level`` beats ``ACTORPY_LOG_LEVEL``, which beats WARNING; a ``level``
    given is put in ``ACTORPY_LOG_LEVEL`` too, so the processes this one starts (an
    embedded cluster's) log at it as well.

    Raises:
        ConfigError: no ``level`` and a ``ACTORPY_LOG_LEVEL`` that is not a level.
    """
    if level:
        os.environ["ACTORPY_LOG_LEVEL"] = level = level.upper()
    chosen = level or env_level() or "WARNING"
    logging.basicConfig(
        level=chosen,
        format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s",
    )


def brief(value: object, limit: int = 40) -> str:
    """A short description of a received value for error messages; never raises.

    A hostile peer chooses what we describe: ``repr`` of an int of more than 4 300 digits
    raises ``ValueError``, of a deeply nested list ``RecursionError``, and of a huge list it
    costs time, so only plain scalars are shown and containers by type and length.

    >>> brief(10 ** 5000), brief([[[]]]), brief(b"x" * 100, 8)
    ('an int of 16610 bits', 'list of length 1', "b'xxxxxx")
    """
    kind = type(value)
    if kind is int and value.bit_length() > 64:  # type: ignore[attr-defined]
        return f"an int of {value.bit_length()} bits"  # type: ignore[attr-defined]
    if kind in (int, float, bool, type(None)):
        return repr(value)[:limit]
    if kind in (bytes, str):
        return repr(value[:limit])[:limit]  # type: ignore[index]
    if kind in (list, tuple, dict, set, frozenset, bytearray):
        return f"{kind.__name__} of length {len(value)}"  # type: ignore[arg-type]
    return f"a {kind.__name__}"


class Throttle:
    """Let a repeated warning through at most once per ``interval_s`` per key, counting the
    ones held back (a misconfigured peer retrying every 100 ms must not flood the log).

    Keys may come from outsiders (a CURVE key anyone can mint), so the table is bounded:
    it remembers at most ``max_keys`` keys, the least recently reported first to go once
    its interval is over. While a flood of fresh keys keeps it full, every further fresh
    key shares one "other" bucket, throttled the same way; its report counts all of them
    (and what evicted keys had held back). Memory stays bounded, and the log still hears
    about the flood once per interval.

    >>> t = Throttle(10.0)
    >>> t.allow("k", now=0.0), t.allow("k", now=1.0), t.allow("k", now=11.0)
    ((True, 0), (False, 0), (True, 1))
    """

    def __init__(self, interval_s: float = 10.0, max_keys: int = 1024) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.interval_s = interval_s
        self.max_keys = max_keys
        # key -> [when it was last let through, how many held back since], in the order
        # they were last let through (the front is the first to expire).
        self._table: OrderedDict[object, list[float]] = OrderedDict()
        self._other = [-math.inf, 0.0]
        self._lock = threading.Lock()

    def allow(self, key: object, now: float | None = None) -> tuple[bool, int]:
        """Whether to log now, and how many were held back since the last one logged (for
        a key in the "other" bucket: held back across all the keys in it)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            entry = self._table.get(key)
            if entry is None:
                if len(self._table) >= self.max_keys and not self._evict_oldest(now):
                    entry = self._other
                else:
                    self._table[key] = [now, 0]
                    return True, 0
            if now - entry[0] < self.interval_s:
                entry[1] += 1
                return False, 0
            held = int(entry[1])
            entry[0], entry[1] = now, 0
            if entry is not self._other:
                self._table.move_to_end(key)
            return True, held

    def log(self, logger: logging.Logger, key: object, msg: str, *args: object,
            level: int = logging.WARNING, exc_info: bool = False) -> None:
        """``logger.log(level, msg, *args)`` if ``key`` is let through now, saying how many
        were held back since; a traceback (``exc_info``) only with the first of a run."""
        allowed, held = self.allow(key)
        if allowed:
            logger.log(level, msg + (" (%d more since the last report)" if held else ""),
                       *args, *((held,) if held else ()),
                       exc_info=True if exc_info and not held else None)

    def _evict_oldest(self, now: float) -> bool:
        """Make room if the oldest key's interval is over (its held-back count moves to
        the "other" bucket); False if every key is still within its interval."""
        oldest, (last, held) = next(iter(self._table.items()))
        if now - last < self.interval_s:
            return False
        del self._table[oldest]
        self._other[1] += held
        return True

    def __len__(self) -> int:
        """Keys remembered (at most ``max_keys``)."""
        return len(self._table)

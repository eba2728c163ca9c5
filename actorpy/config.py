"""One frozen Config, read once at connect()/CLI start and passed down.

Precedence: explicit argument > ``ACTORPY_*`` environment variable > default.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

from actorpy.errors import ConfigError


@dataclass(frozen=True)
class Config:
    """Runtime settings. Every field can be set as ``ACTORPY_<FIELD>`` (upper case).

    Attributes:
        workers: worker processes of the embedded local cluster (None: one per core).
        heartbeat_interval_s: how often a node tells the manager it is alive (a Python
            timer), and how often libzmq pings over the links the manager and members
            watch (in C, without the GIL: see actorpy.runtime.liveness).
        dead_after_s: a node whose connection to the manager is down (killed, stopped,
            cut off) is declared dead within ``dead_after_s + 2 * heartbeat_interval_s``
            (a killed one after about ``dead_after_s / 2``). Heartbeat silence alone (a
            process holding the GIL in a long C call) only makes it *suspect* after
            ``dead_after_s``.
        silent_dead_after_s: heartbeat silence, on a connection that stays up, after which
            a node is declared dead anyway (a process stuck for good); 0: never.
        manager_timeout_s: a member leaves when its connection to the manager has been down
            this long, or the manager has not answered a heartbeat for this long while the
            member's own loop was running (how a node declared dead is fenced off).
        start_timeout_s: how long connect() waits for the cluster to come up.
        task_threads: tasks a worker runs at once.
        chunk_bytes: buffers larger than this travel as several frames (None: 8 MiB under
            CURVE, 64 MiB over ipc, the faster choice for each in bench/transport.py).
        max_frame_bytes: a received frame larger than this is refused. libzmq checks it
            before keeping any byte (``ZMQ_MAXMSGSIZE``, also during the CURVE handshake,
            so an outsider cannot make a node buffer more); a frame a little over it from a
            member is dropped with a WARNING naming the sender, a much bigger one closes
            the connection.
        linger_ms: how long closing sockets may flush pending messages.
        local_transport: "auto" (ipc where available), "ipc", or "tcp" (127.0.0.1 with
            CURVE and a fresh secret) for the embedded local cluster.
    """

    workers: int | None = None
    heartbeat_interval_s: float = 0.25
    dead_after_s: float = 2.0
    silent_dead_after_s: float = 300.0
    manager_timeout_s: float = 5.0
    start_timeout_s: float = 30.0
    task_threads: int = 1
    chunk_bytes: int | None = None
    max_frame_bytes: int = 1 << 30
    linger_ms: int = 500
    local_transport: str = "auto"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.name} must be a finite number, got {value}")
        if self.workers is not None and self.workers < 0:
            raise ConfigError("workers must be >= 0")
        if self.heartbeat_interval_s <= 0 or self.dead_after_s <= 2 * self.heartbeat_interval_s:
            raise ConfigError("need 0 < 2 * heartbeat_interval_s < dead_after_s")
        if self.silent_dead_after_s < 0 or 0 < self.silent_dead_after_s <= self.dead_after_s:
            raise ConfigError("silent_dead_after_s must be 0 (never) or more than dead_after_s")
        if self.manager_timeout_s <= self.heartbeat_interval_s:
            raise ConfigError("need manager_timeout_s > heartbeat_interval_s")
        chunk = 64 << 20 if self.chunk_bytes is None else self.chunk_bytes
        if self.task_threads < 1 or chunk < 1 or self.max_frame_bytes < chunk:
            raise ConfigError("need task_threads >= 1 and 1 <= chunk_bytes <= max_frame_bytes")
        if self.local_transport not in ("auto", "ipc", "tcp"):
            raise ConfigError(f"local_transport must be auto, ipc or tcp, not {self.local_transport!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **explicit: Any) -> Config:
        """Build a Config: ``explicit`` (non-None values) > ``ACTORPY_*`` in ``env`` > defaults.

        >>> Config.from_env({"ACTORPY_DEAD_AFTER_S": "2.5"}, workers=3).dead_after_s
        2.5
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if explicit.get(f.name) is not None:
                values[f.name] = explicit[f.name]
                continue
            raw = env.get(f"ACTORPY_{f.name.upper()}")
            if raw is None or raw == "":
                continue
            ftype = str(f.type)
            kind = float if "float" in ftype else int if "int" in ftype else str
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise ConfigError(f"ACTORPY_{f.name.upper()}={raw!r} is not a {kind.__name__}")
        unknown = set(explicit) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
        return cls(**values)

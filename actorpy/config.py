"""One frozen Config, read once at connect()/CLI start and passed down.

Precedence: explicit argument > ``ACTORPY_*`` environment variable > default.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Mapping

from actorpy.errors import ConfigError


#: Task slots a worker may offer; the manager ignores a registration with more.
MAX_TASK_THREADS = 4096
#: ``max_frame_bytes`` over ipc (the senders' chunks there); under CURVE it is 8 MiB, the
#: chunk size there: the most a connection may make a node buffer before its handshake
#: proved the secret (``Node``; before 64 MiB everywhere: 30 connections without the secret
#: held 1.8 GB of a manager's memory for the 10 s of their handshake)
MAX_FRAME_BYTES = 64 << 20


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
        chunk_bytes: buffers and pickled bodies larger than this travel as several frames
            (None: 8 MiB under CURVE, 64 MiB over ipc, the faster choice for each in
            bench/transport.py, and never more than max_frame_bytes).
        max_frame_bytes: a received frame larger than this is refused (None: the chunk
            size, 8 MiB under CURVE and 64 MiB over ipc, or ``chunk_bytes`` if larger).
            libzmq checks it before keeping any byte (``ZMQ_MAXMSGSIZE``, also during the
            CURVE handshake, so an outsider cannot make a node buffer more than this per
            connection); a frame a little over it from a member is dropped with a WARNING
            naming the sender, a much bigger one closes the connection. Senders split what
            they send so no frame exceeds it, so a value of any size still travels. Set it
            (and ``chunk_bytes``) alike on every node of a cluster.
        linger_ms: how long closing sockets may flush pending messages.
        local_transport: "auto" (ipc where available), "ipc", or "tcp" (127.0.0.1 with
            CURVE and a fresh secret) for the embedded local cluster.
        local_start: how the embedded local cluster starts its processes: "auto" (forked
            from the driver while it has a single thread, else fresh interpreters) or
            "spawn" (always fresh interpreters); see runtime/launch.py.
        service_inbox_items, service_inbox_bytes: a service's inbox high-water marks
            (messages, and their bytes); beyond them a request gets a ServiceOverloaded
            ERROR at once and a cast is dropped with a WARNING (the I/O thread never waits).
        stream_window_items, stream_window_bytes: how far a streaming task's ``emit`` may
            run ahead of the driver consuming its items (flow control: the driver holds at
            most this much, plus one item).
        store_budget_bytes: memory each worker's object store may fill before it spills
            blocks to files (None: a quarter of physical memory, or of the cgroup limit,
            divided by ``workers``, else by the number of cores; at least 64 MiB).
        store_dir: where workers make their private spill directories (None: the embedded
            cluster's own private directory, or the system's temporary directory).
    """

    workers: int | None = None
    heartbeat_interval_s: float = 0.25
    dead_after_s: float = 2.0
    silent_dead_after_s: float = 300.0
    manager_timeout_s: float = 5.0
    start_timeout_s: float = 30.0
    task_threads: int = 1
    chunk_bytes: int | None = None
    max_frame_bytes: int | None = None
    linger_ms: int = 500
    local_transport: str = "auto"
    local_start: str = "auto"
    service_inbox_items: int = 10_000
    service_inbox_bytes: int = 256 << 20
    stream_window_items: int = 64
    stream_window_bytes: int = 64 << 20
    store_budget_bytes: int | None = None
    store_dir: str | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            _check_type(f.name, str(f.type), value)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.name} must be a finite number, got {value}")
        if self.workers is not None and self.workers < 1:
            # 0 passed here and connect() then said "needs workers >= 1"; -1 said ">= 0"
            raise ConfigError(f"workers (worker processes of the embedded local cluster) "
                              f"must be >= 1, got {self.workers}")
        if self.heartbeat_interval_s <= 0 or self.dead_after_s <= 2 * self.heartbeat_interval_s:
            raise ConfigError("need 0 < 2 * heartbeat_interval_s < dead_after_s")
        if self.silent_dead_after_s < 0 or 0 < self.silent_dead_after_s <= self.dead_after_s:
            raise ConfigError("silent_dead_after_s must be 0 (never) or more than dead_after_s")
        if self.manager_timeout_s <= self.heartbeat_interval_s:
            raise ConfigError("need manager_timeout_s > heartbeat_interval_s")
        # Unset, chunk_bytes follows the transport, never above max_frame_bytes (see Node).
        limit = MAX_FRAME_BYTES if self.max_frame_bytes is None else self.max_frame_bytes
        chunk = min(64 << 20, limit) if self.chunk_bytes is None else self.chunk_bytes
        # more threads than MAX_TASK_THREADS: the manager would ignore the registration
        if not 1 <= self.task_threads <= MAX_TASK_THREADS:
            raise ConfigError(f"task_threads (--threads) must be 1 to {MAX_TASK_THREADS}, "
                              f"got {self.task_threads}")
        if chunk < 1 or (self.max_frame_bytes is not None and self.max_frame_bytes < chunk):
            raise ConfigError(f"need 1 <= chunk_bytes <= max_frame_bytes, got chunk_bytes="
                              f"{chunk} and max_frame_bytes={self.max_frame_bytes}")
        if min(self.service_inbox_items, self.service_inbox_bytes, self.stream_window_items,
               self.stream_window_bytes) < 1:
            raise ConfigError("service_inbox_* and stream_window_* must be >= 1")
        if not 0 <= self.linger_ms < 1 << 31:
            # ZeroMQ's -1 waits for ever: terminate() of a driver holding messages for a
            # killed worker took 10 s, then said its I/O thread was still busy
            raise ConfigError(f"linger_ms must be 0 to {(1 << 31) - 1} milliseconds, got "
                              f"{self.linger_ms}")
        if self.store_budget_bytes is not None and self.store_budget_bytes < 0:
            raise ConfigError("store_budget_bytes must be >= 0 (0: every block spills)")
        if self.local_transport not in ("auto", "ipc", "tcp"):
            raise ConfigError("local_transport must be auto, ipc or tcp, "
                              f"not {self.local_transport!r}")
        if self.local_start not in ("auto", "spawn"):
            raise ConfigError(f"local_start must be auto or spawn, not {self.local_start!r}")

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
                raise ConfigError(f"ACTORPY_{f.name.upper()}={raw!r} is not "
                                  f"{_KIND_NAMES[kind.__name__]}")
        unknown = set(explicit) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
        return cls(**values)


#: How a field's kind reads in a message.
_KIND_NAMES = {"int": "an int", "float": "a number", "str": "a str"}


def _check_type(name: str, annotation: str, value: Any) -> None:
    """Refuse a value of the wrong type for field ``name`` (its annotation as text).

    A str, float or bool where an int goes (``connect(workers=2.5)``, ``workers="2"``)
    failed later and far away: a TypeError at a comparison, or the embedded manager
    exiting on ``ACTORPY_WORKERS='2.5'``, a variable the caller never set.

    Raises:
        ConfigError: naming the field, the kind it takes and the value given.
    """
    if value is None and "None" in annotation:
        return
    kind = "float" if "float" in annotation else "int" if "int" in annotation else "str"
    if kind == "str":
        ok = isinstance(value, (str, os.PathLike))   # store_dir may be a pathlib.Path
    else:
        wanted = numbers.Real if kind == "float" else numbers.Integral
        ok = isinstance(value, wanted) and not isinstance(value, bool)
    if not ok:
        optional = " (or None)" if "None" in annotation else ""
        raise ConfigError(f"{name} must be {_KIND_NAMES[kind]}{optional}, got {value!r}")

"""actorpy: a distributed functional dataflow engine in the style of Actor (Owl).

Files and packages:
    errors.py   ActorpyError and its family (RemoteError, NodeLost, timeouts, ...)
    ids.py      NodeId / JobId / TaskId, minted from an injected rng
    config.py   the frozen Config (argument > ACTORPY_* > default)
    clock.py    Clock protocol, SystemClock, FakeClock
    log.py      logger helpers; only the CLI configures logging
    wire/       header frame, serde (the only unpickler), auth (ipc / CURVE)
    runtime/    node (sockets + I/O loop), manager, worker, membership, local cluster, Cluster
    barrier/    BSP, SSP, ASP, PSP, DSSP decisions, LB-BSP, the simulator (pure)
    cli.py      `actorpy manager|worker|status|demo|sim|secret`
    demo.py     what `actorpy demo` runs
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["connect", "Cluster", "Config", "NodeId", "ServiceRef", "ActorpyError",
           "RemoteError", "NodeLost", "ActorpyTimeout", "BarrierTimeout", "ConfigError",
           "ProtocolError", "AuthError", "SerializationError", "__version__"]

from actorpy.config import Config
from actorpy.errors import (ActorpyError, ActorpyTimeout, AuthError, BarrierTimeout, ConfigError,
                            NodeLost, ProtocolError, RemoteError, SerializationError)
from actorpy.ids import NodeId


def __getattr__(name: str) -> Any:
    # The runtime pulls in zmq; load it on first use, not at import.
    if name in ("connect", "Cluster"):
        from actorpy.runtime import cluster

        return getattr(cluster, name)
    if name == "ServiceRef":
        from actorpy.runtime.context import ServiceRef

        return ServiceRef
    raise AttributeError(f"module 'actorpy' has no attribute {name!r}")

"""Parameter-server engine: Actor's ``register_schedule/push/pull/barrier/stop`` over server
shards hosted as core services, with BSP/SSP/ASP/PSP/DSSP barriers, LB-BSP batch sizes,
elastic workers and checkpoints.

Files:
    job.py         Job: the callback registry, ``run`` / ``start``
    driver.py      Run: starts the shards and the job's conductor, waits for the model
    conductor.py   Conductor: a named service on the driver; worker tasks (joiners too),
                   membership, shard restarts, the shard directory, collecting the model
    worker.py      WorkerTask (the pull-compute-push loop), WorkerContext, DataContext
    shell.py       ShardService: the only glue between the server core and core services
    server.py      ServerCore (sans-I/O): steps, barrier, deferred releases, update checks
    aggregate.py   a pull's updates combined: each key's mean or sum, packed groups at once
    gate.py        the barrier policies as a shard applies them (FullView, SampledView, DSSP)
    tuning.py      LB-BSP batch sizes and the straggler release policy
    store.py       Store (key -> (value, clock)), stable key sharding, update validation
    checkpoint.py  atomic .npz checkpoints (no unpickling), refused whole when corrupt
    kinds.py       this engine's message kinds and wire records
    packing.py     a message's small arrays of one dtype packed into one buffer, and back
    errors.py      UpdateError, CheckpointError, KeyNotLocal, CallbackError, JobFailed
"""
from __future__ import annotations

from engines.param.driver import Run, RunStats
from engines.param.errors import (CallbackError, CheckpointError, JobFailed, KeyNotLocal,
                                  ParamError, UpdateError)
from engines.param.job import Job, balances
from engines.param.store import Store
from engines.param.worker import DataContext, WorkerContext

__all__ = ["Job", "balances", "Run", "RunStats", "Store", "WorkerContext", "DataContext",
           "ParamError", "UpdateError", "CheckpointError", "KeyNotLocal", "CallbackError",
           "JobFailed"]

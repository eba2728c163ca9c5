"""Map-reduce engine: lazy, immutable datasets run as fused stages on a cluster.

    import operator, actorpy
    from engines import mapre

    with actorpy.connect(workers=2) as cluster:
        counts = (mapre.load(cluster, "books/*.txt")
                  .flat_map(str.split)
                  .map(str.lower)
                  .map(lambda w: (w, 1))
                  .reduce_by_key(operator.add)
                  .collect(timeout_s=300))

Files:
    sources.py    load (text files, byte-range splits), from_items; the public entry points
    dataset.py    Dataset[T]: transformations (lazy) and actions (run a job)
    actions.py    the actions on the driver; collect streams partitions back
    plan.py       logical plan nodes; narrow steps fuse as the plan is built (pure)
    ops.py        narrow steps as chains of builtin iterators (pure)
    partition.py  stable key hashing (never hash() on str), range bounds for sorts (pure)
    scheduler.py  Job: stages in order, BSP barrier between them, lineage recomputation
    engine.py     per-cluster state: lost workers, slots, job ids
    tasks.py      what runs on workers: partition specs and sinks
    shuffle.py    map-side combine and bucketing, worker-to-worker fetch, reduce-side merge
    io.py         split reading on line boundaries, part files with _SUCCESS
    broadcast.py  broadcast(cluster, value) -> Broadcast, read in tasks as .value
    progress.py   tqdm progress bars on a terminal (progress=False / ACTORPY_PROGRESS=0)
    errors.py     MapreError and its family
"""
from __future__ import annotations

from engines.mapre.broadcast import Broadcast, broadcast
from engines.mapre.dataset import DEFAULT_TIMEOUT_S, Dataset
from engines.mapre.errors import (ArgumentError, EmptyDatasetError, FetchFailed, InputDecodeError,
                                  InputChanged, InputNotFound, InputNotWords, JobFailed, MapreError,
                                  OutputExists)
from engines.mapre.io import list_inputs
from engines.mapre.sources import from_items, load

__all__ = ["load", "from_items", "broadcast", "list_inputs", "Dataset", "Broadcast",
           "DEFAULT_TIMEOUT_S", "MapreError", "ArgumentError", "InputNotFound", "InputDecodeError",
           "OutputExists", "InputNotWords", "InputChanged", "EmptyDatasetError", "FetchFailed",
           "JobFailed"]

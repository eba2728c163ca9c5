"""The actions, as run on the driver: each is one ``Job`` over the dataset's plan.

``collect``/``iterate`` stream: result partitions stay in the workers' stores (small ones
come back inline with the task's reply) and the driver fetches them one partition at a
time, a chunk ahead, deleting each on its worker once read; if a holder dies meanwhile,
that partition is recomputed and reading resumes where it stopped.
"""
from __future__ import annotations

import heapq
import os
from functools import reduce as _reduce
from itertools import chain
from typing import Any, Callable, Iterator

from actorpy.errors import NodeLost, RemoteError
from engines.mapre import io
from engines.mapre import plan as P
from engines.mapre.codec import iter_unpacked, unpack
from engines.mapre.engine import Engine
from engines.mapre.errors import ArgumentError, EmptyDatasetError, JobFailed, OutputExists
from engines.mapre.scheduler import MAX_ATTEMPTS, Job, Stage
from engines.mapre.shuffle import combine
from engines.mapre.tasks import (Collect, CombineByKey, Count, Fold, Reduce, Save, Take,
                                 TaskOutcome, Top)

#: Result partitions up to this many items come back inside the task's reply.
INLINE_ITEMS = 2048


def iterate(engine: Engine, node: P.Node, timeout_s: float,
            progress: bool | None) -> Iterator[Any]:
    job = Job(engine, "collect", node, timeout_s, progress)
    try:
        def sink_for(part: int) -> Collect:
            return Collect(f"{job.prefix}/out/{part}", INLINE_ITEMS)
        stage = job.run(node, "collect", sink_for)
        for part in range(node.partitions):
            yield from _stream(job, stage, part, sink_for)
    finally:
        job.__exit__()


def _stream(job: Job, stage: Stage, part: int, sink_for: Callable[[int], Any]) -> Iterator[Any]:
    cluster = job.engine.cluster
    key = f"{job.prefix}/out/{part}"
    done, failures = 0, 0
    while True:
        out = stage.outputs.get((0, part))
        if out is None:
            job.rerun(stage, part, sink_for)
            continue
        worker, outcome = out
        kind, payload = outcome.value
        if kind == "inline":
            yield from payload
            break
        try:
            # one segment (about one packed chunk) at a time, the next already on its way
            for i, chunk in enumerate(cluster.fetch_iter(worker, f"{key}/b",
                                                         timeout_s=job.left_s())):
                if i >= done:  # after a re-run: skip what was already yielded
                    data = unpack(chunk)
                    done += 1
                    yield from data
            job.engine.delete([worker], (key + "/",), wait_s=None)
            break
        except (NodeLost, RemoteError) as exc:  # the holder died (or lost the block)
            failures += 1
            if failures >= MAX_ATTEMPTS:
                raise JobFailed(f"collect: partition {part} could not be read back from "
                                f"{worker}: {exc}") from exc
            job.suspects.add(worker)
            job.rerun(stage, part, sink_for)
    stage.keys.remove((0, part))  # read: a later loss of its worker costs nothing
    stage.outputs.pop((0, part), None)


def _values(stage: Stage) -> list[Any]:
    return [stage.outputs[k][1].value for k in sorted(stage.outputs)]


def count(engine: Engine, node: P.Node, timeout_s: float, progress: bool | None) -> int:
    with Job(engine, "count", node, timeout_s, progress) as job:
        return sum(_values(job.run(node, "count", lambda p: Count())))


def reduce(engine: Engine, node: P.Node, op: Callable[[Any, Any], Any], timeout_s: float,
           progress: bool | None) -> Any:
    with Job(engine, "reduce", node, timeout_s, progress) as job:
        partials = [v for ok, v in _values(job.run(node, "reduce", lambda p: Reduce(op))) if ok]
    if not partials:
        raise EmptyDatasetError("reduce() of an empty dataset; use fold(zero, op) to get a "
                                "value for no items")
    return _reduce(op, partials)


def fold(engine: Engine, node: P.Node, zero: Any, op: Callable[[Any, Any], Any],
         timeout_s: float, progress: bool | None) -> Any:
    with Job(engine, "fold", node, timeout_s, progress) as job:
        partials = _values(job.run(node, "fold", lambda p: Fold(zero, op)))
    return _reduce(op, partials, zero)


def reduce_by_key_locally(engine: Engine, node: P.Node, op: Callable[[Any, Any], Any],
                          timeout_s: float, progress: bool | None) -> dict[Any, Any]:
    """Each partition's pairs combined on its worker, then merged here as the tasks come
    back (while the others still run): no shuffle and no second stage."""
    acc: dict[Any, Any] = {}

    def merge(part: int, outcome: TaskOutcome) -> None:
        for chunk in outcome.value:
            pairs = iter_unpacked(chunk)
            if acc:
                combine(pairs, op, acc)
            else:
                acc.update(pairs)  # the keys of one partition's output are distinct

    with Job(engine, "reduce_by_key_locally", node, timeout_s, progress) as job:
        job.run(node, "reduce_by_key_locally", lambda p: CombineByKey(op), consume=merge)
    return acc


def take(engine: Engine, node: P.Node, n: int, timeout_s: float,
         progress: bool | None) -> list[Any]:
    """The first ``n`` items: partition 0 first, then 4x more partitions per round."""
    out: list[Any] = []
    if n <= 0:
        return out
    with Job(engine, "take", node, timeout_s, progress) as job:
        start, batch = 0, 1
        while len(out) < n and start < node.partitions:
            parts = list(range(start, min(start + batch, node.partitions)))
            need = n - len(out)
            stage = job.run(node, "take", lambda p: Take(need), parts, release=False)
            for data in _values(stage):
                out.extend(data)
            start, batch = start + len(parts), batch * 4
    return out[:n]


def top(engine: Engine, node: P.Node, n: int, key: Callable[[Any], Any] | None,
        timeout_s: float, progress: bool | None) -> list[Any]:
    if n <= 0:
        return []
    with Job(engine, "top", node, timeout_s, progress) as job:
        partials = _values(job.run(node, "top", lambda p: Top(n, key)))
    return heapq.nlargest(n, chain.from_iterable(partials), key=key)


def save(engine: Engine, node: P.Node, directory: str | os.PathLike[str], overwrite: bool,
         timeout_s: float, progress: bool | None) -> str:
    given = os.fspath(directory) if isinstance(directory, (str, os.PathLike)) else None
    if not isinstance(given, str) or not given:   # "" was the driver's current directory
        raise ArgumentError(f"save() takes a directory as a non-empty str or os.PathLike, "
                            f"got {directory!r}")
    path = os.path.abspath(given)
    if overwrite and os.path.isdir(path):  # overwriting would delete the input before it is read
        here = os.path.realpath(path)
        inputs = {os.path.realpath(os.path.dirname(split.path)) for n in P.walk(node)
                  if isinstance(n, P.TextSource) for part in n.splits for split in part}
        if here in inputs:
            raise OutputExists(f"save(): {path!r} holds files this dataset reads; save to "
                               "another directory (then move it), not over its own input")
    io.prepare_output(path, overwrite)
    with Job(engine, "save", node, timeout_s, progress) as job:
        job.run(node, "save", lambda p: Save(path, p))
    io.finish_output(path, node.partitions)
    return path


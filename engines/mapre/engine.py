"""The engine's state for one cluster: which workers were lost, how many tasks each worker
runs at once, and job ids. One per ``Cluster`` handle (looked up by the handle, held only
weakly, so a terminated cluster is not kept alive by the engine)."""
from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from typing import Any, Iterable

from actorpy.errors import ActorpyError
from actorpy.ids import NodeId
from engines.mapre.errors import MapreError
from engines.mapre.tasks import DeleteTask

log = logging.getLogger(__name__)

_engines: weakref.WeakKeyDictionary[Any, Engine] = weakref.WeakKeyDictionary()
_engines_lock = threading.Lock()


def engine_for(cluster: Any) -> Engine:
    """The engine state of ``cluster`` (made on first use)."""
    with _engines_lock:
        engine = _engines.get(cluster)
        if engine is None:
            engine = _engines[cluster] = Engine(cluster)
        return engine


class Engine:
    """Per-cluster state shared by every dataset and job of that cluster.

    Args:
        cluster: a connected ``actorpy.Cluster``.
    """

    def __init__(self, cluster: Any) -> None:
        self._cluster = weakref.ref(cluster)
        self.owner = str(cluster.node_id)
        self._lock = threading.Lock()
        self._lost: set[NodeId] = set()
        self._slots: dict[NodeId, int] = {}
        self._jobs = itertools.count(1)
        cluster.on_node_lost(self._node_lost)

    @property
    def cluster(self) -> Any:
        cluster = self._cluster()
        if cluster is None:
            raise MapreError("the cluster of this dataset is gone; connect again and rebuild it")
        return cluster

    def _node_lost(self, node: NodeId) -> None:
        # Runs on the cluster's I/O thread: record only, never block.
        with self._lock:
            self._lost.add(node)

    def lost(self) -> set[NodeId]:
        """Workers declared dead since this engine was made."""
        with self._lock:
            return set(self._lost)

    def workers(self) -> list[NodeId]:
        """Live workers, in a stable order."""
        lost = self.lost()
        return [w for w in self.cluster.workers() if w not in lost]

    def slots(self, worker: NodeId) -> int:
        """How many tasks ``worker`` runs at once (its ``task_threads``)."""
        if worker not in self._slots:
            try:
                rows = self.cluster.nodes(timeout_s=10.0)
            except ActorpyError as exc:
                log.warning("could not read the node table (%s); assuming 1 slot per worker", exc)
                rows = []
            for row in rows:
                if row.get("role") == "worker":
                    self._slots[NodeId(row["node_id"])] = max(1, int(row.get("slots", 1)))
            self._slots.setdefault(worker, 1)
        return self._slots[worker]

    def new_job_id(self) -> str:
        return f"{self.owner}-j{next(self._jobs)}"

    def submit(self, task: Any, worker: NodeId) -> Any:
        return self.cluster.submit_task(task, worker)

    def cancel(self, futures: Iterable[Any], within_s: float) -> None:
        """Cancel the tasks of ``futures`` and wait, ``within_s`` in all, for their workers to
        say so: a queued task then never starts, even where the one running before it ends
        at once (a cancel only sent may reach its worker after that). Past ``within_s``, or
        where the worker does not answer, the cancel is only sent."""
        deadline = time.monotonic() + within_s
        for fut in futures:
            left = deadline - time.monotonic()
            if left <= 0 or fut.done():
                fut.cancel()
                continue
            try:
                self.cluster.cancel(fut, timeout_s=left)
            except ActorpyError as exc:
                log.debug("cancel of a task on %s not confirmed: %s", fut.dest, exc)
                fut.cancel()

    def delete(self, workers: Iterable[NodeId], prefixes: tuple[str, ...],
               wait_s: float | None) -> None:
        """Delete stored keys under ``prefixes`` on ``workers`` (dead ones are skipped);
        waits up to ``wait_s`` for them (None: do not wait)."""
        lost = self.lost()
        futures = []
        for w in set(workers) - lost:
            try:
                futures.append(self.submit(DeleteTask(prefixes), w))
            except ActorpyError as exc:
                log.debug("could not ask %s to delete %s: %s", w, prefixes, exc)
        if wait_s is None:
            return
        for fut in futures:
            try:
                fut.result(wait_s)
            except ActorpyError as exc:  # a worker that died holds nothing any more
                log.debug("delete of %s on %s failed: %s", prefixes, fut.dest, exc)


def release_cache(engine_ref: Any, prefix: str, locations: dict[int, Any]) -> None:
    """When a cached dataset is garbage collected, free its partitions (best effort)."""
    engine = engine_ref()
    holders = {node for node, _ in list(locations.values())}
    if engine is None or not holders:
        return
    try:
        engine.delete(holders, (prefix + "/",), wait_s=None)
    except Exception as exc:  # the cluster may be gone already: nothing left to free
        log.debug("could not free cache %s: %s", prefix, exc)

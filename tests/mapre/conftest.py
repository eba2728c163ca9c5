"""Shared clusters for the map-reduce tests: one embedded cluster per size (1, 2 and 3
workers), started once per session, so property tests can vary the worker count cheaply."""
from __future__ import annotations

from typing import Any

import pytest

import actorpy


class StoreSize:
    """Task: how many keys this worker's object store holds under ``prefix``."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def run(self, ctx: Any) -> int:
        return len(ctx.store.keys(self.prefix))


def stored_keys(cluster: Any, prefix: str = "mapre/") -> int:
    """Keys under ``prefix`` in the stores of all live workers of ``cluster``."""
    futures = [cluster.submit_task(StoreSize(prefix), w) for w in cluster.workers()]
    return sum(f.result(30) for f in futures)


@pytest.fixture(scope="session")
def clusters():
    """{workers: cluster} for 1, 2 and 3 workers."""
    made: dict[int, Any] = {}
    try:
        for n in (1, 2, 3):
            made[n] = actorpy.connect(workers=n)
        yield made
    finally:
        for cluster in made.values():
            cluster.terminate()


@pytest.fixture(scope="session")
def cluster(clusters):
    """The 2-worker shared cluster."""
    return clusters[2]

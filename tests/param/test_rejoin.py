"""A worker rejoining restarted shards (engines/param/worker.py ``_Loop._collect``), on a
fake context: with ``servers=2``, both shard hosts killed at once.

The conductor restarts each lost shard and hands the worker a directory newer than the one
it had. Found by a sweep (3 workers, SSP, both shard hosts SIGKILLed): the first lookup
could bring a directory naming *both* replacements; the worker then asked again for the
other shard, for a directory newer than that, which never came (the job waited out its
timeout_s), or, that shard having answered before its host died, pushed to the replacement
without joining it and was answered RELEASED ("a persistent straggler")."""
from __future__ import annotations

import concurrent.futures as cf
from types import SimpleNamespace
from typing import Any

import pytest

from actorpy.errors import ActorpyTimeout, NodeLost
from actorpy.ids import NodeId
from actorpy.runtime.context import ServiceRef
from engines.param.kinds import ParamKind, Status
from engines.param.worker import WorkerTask, _Loop

ME, DRIVER = NodeId("w-3"), NodeId("d-1")
OLD = [ServiceRef(NodeId("w-1"), 1, "j/shard0"), ServiceRef(NodeId("w-2"), 1, "j/shard1")]
NEW = [ServiceRef(ME, 2, "j/shard0"), ServiceRef(ME, 1, "j/shard1")]
CONDUCTOR = ServiceRef(DRIVER, 1, "j/conductor")


class FakeNode:
    def wait(self, futures: Any, timeout_s: float) -> list[cf.Future]:
        return [f for f in futures if f.done()]   # every fake answer is there at once

    def forget(self, fut: cf.Future) -> None:
        pass


class FakeCtx:
    """Shards that answer GO at once, those on a dead host NodeLost; a conductor that has
    restarted both shards (generation 2) and parks a request for anything newer, as the
    real one does, until the job's timeout."""

    node_id = ME

    def __init__(self, dead: set[ServiceRef]) -> None:
        self.node = FakeNode()
        self.dead = dead
        self.sent: list[tuple[ServiceRef, int]] = []
        self.lookups: list[int] = []

    def call_async(self, ref: ServiceRef, kind: int, payload: Any, direct: bool) -> cf.Future:
        self.sent.append((ref, kind))
        fut: cf.Future = cf.Future()
        if ref in self.dead:
            fut.set_exception(NodeLost(ref.node, f"node {ref.node} is dead"))
        else:
            fut.set_result((Status.GO, 7, ref, None, None))   # the values: who answered
        return fut

    def call(self, ref: ServiceRef, kind: int, generation: int, timeout_s: float) -> Any:
        assert ref == CONDUCTOR and kind == ParamKind.SHARDS
        self.lookups.append(generation)
        if generation >= 2:
            raise ActorpyTimeout("parked until the job's timeout")
        return 2, tuple(NEW)


def _loop(ctx: FakeCtx) -> _Loop:
    task = WorkerTask(lambda c, v: {}, None, tuple(OLD), {"w": 0}, CONDUCTOR, 0, 2, 3, 0,
                      8, 60.0)
    return _Loop(task, ctx)


def _push() -> list[tuple[int, Any]]:
    return [(ParamKind.PUSH, (7, {}, 8, 0.01))] * 2


class TestBothShardHostsLost:
    def test_a_replacement_the_directory_named_already_is_joined_not_asked_for(self):
        ctx = FakeCtx(dead=set(OLD))
        replies = _loop(ctx)._exchange(_push(), step=6)   # before: JobFailed (a timeout)
        assert ctx.lookups == [0]
        assert [r[2] for r in replies] == NEW
        joins = [ref for ref, kind in ctx.sent if kind == ParamKind.JOIN]
        assert sorted(joins, key=str) == sorted(NEW, key=str)

    def test_a_shard_that_answered_before_its_host_died_is_joined_at_its_replacement(self):
        ctx = FakeCtx(dead={OLD[1]})   # shard 0 answered the push, then its host died
        loop = _loop(ctx)
        replies = loop._exchange(_push(), step=6)
        # before: shard 0's answer was kept, and the next push went to its replacement,
        # which the worker never joined (answered RELEASED)
        assert [r[2] for r in replies] == NEW
        assert (NEW[0], ParamKind.JOIN) in ctx.sent and loop.refs == NEW
        assert ctx.lookups == [0]


@pytest.mark.parametrize("dead", [set(), {OLD[0]}], ids=["none", "one"])
def test_one_shard_or_none_lost_is_as_before(dead):
    ctx = FakeCtx(dead=dead)
    ctx.call = lambda ref, kind, generation, timeout_s: (1, (NEW[0], OLD[1]))
    loop = _loop(ctx)
    replies = loop._exchange(_push(), step=6)
    assert [r[2] for r in replies] == ([NEW[0], OLD[1]] if dead else OLD)
    assert [kind for _, kind in ctx.sent].count(ParamKind.JOIN) == len(dead)
    assert loop.refs == ([NEW[0], OLD[1]] if dead else OLD)



def test_a_timeout_does_not_say_data_has_not_returned_of_a_worker_that_trained():
    # The coordinator shard restarted from its checkpoint: its history holds the workers of
    # the checkpoint's table, its steps table none that has not rejoined. Before, the
    # timeout said of such a worker "has not joined: its data= has not returned".
    from engines.param.conductor import Conductor
    conductor = object.__new__(Conductor)   # what _late reads, past the deadline
    conductor.name, conductor.run = "j", SimpleNamespace(
        failure=None, options=SimpleNamespace(timeout_s=25.0))
    conductor._running = {ME: None, NodeId("w-4"): None}
    conductor._restarted, conductor._parked, conductor._grace = {0}, [], object()
    conductor._stopped = conductor._over = False
    conductor._halted = conductor._asking = True
    stats: cf.Future = cf.Future()
    stats.set_result({"steps": {}, "history": {ME: 204}})
    conductor._late(stats)
    said = str(conductor.run.failure)
    assert "(steps completed: w-3 204, w-4 -; w-4 has not joined: its data=" in said
    assert "w-3 trained with server shard 0 but is not in its table now, and has not " \
           "rejoined it since it was restarted" in said
    assert "w-3 has not joined" not in said

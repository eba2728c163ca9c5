"""The shard service's plumbing (engines/param/shell.py) on a fake service context: which
answers go out, and in which order."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from actorpy.barrier import BSP
from actorpy.ids import NodeId
from actorpy.runtime.node import NodeEvent, NodeEventKind
from engines.param.kinds import Status
from engines.param.server import Callbacks, ShardConfig
from engines.param.shell import ShardService, ShardSpec
from engines.param.store import plan_shards
from tests.param.harness import sgd_pull

HERE, FAR, GONE = NodeId("w-1"), NodeId("w-2"), NodeId("w-3")   # HERE sorts first


class Sent:
    """Every answer the shard sends, in order: (worker, status, step)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int, int]] = []


class FakeReply:
    def __init__(self, sender: NodeId, sent: Sent) -> None:
        self.sender, self._sent, self.done = sender, sent, False

    def send(self, value: Any) -> None:
        self.done = True
        self._sent.log.append((self.sender, value[0], value[1]))

    def fail(self, exc: BaseException) -> None:
        self.done = True
        self._sent.log.append((self.sender, -1, -1))


class FakeEnv:
    def __init__(self, sender: NodeId, sent: Sent) -> None:
        self.sender, self._sent = sender, sent
        self.reply: FakeReply | None = None

    def defer(self) -> FakeReply:
        if self.reply is None:
            self.reply = FakeReply(self.sender, self._sent)
        return self.reply


class FakeNode:
    def is_dead(self, node_id: NodeId) -> bool:
        return False


class FakeCtx:
    """What ShardService uses of its ServiceContext."""

    node_id = HERE

    def __init__(self) -> None:
        self.node = FakeNode()
        self.listeners: list[Callable[[NodeEvent], None]] = []

    def subscribe(self, listener: Callable[[NodeEvent], None]) -> None:
        self.listeners.append(listener)


def shard(workers: list[NodeId]) -> tuple[ShardService, FakeCtx, Sent]:
    init = {"w": np.zeros(4, dtype=np.float32)}
    spec = ShardSpec(ShardConfig(policy=BSP(), expected=frozenset(workers)),
                     Callbacks(sgd_pull()), plan_shards(init, 1))
    ctx = FakeCtx()
    return ShardService(ctx, spec, init), ctx, Sent()  # type: ignore[arg-type]


def call(service: ShardService, sent: Sent, worker: NodeId, handler: str, payload: Any) -> None:
    """Run a handler as the runtime would: a returned value is the worker's answer."""
    env = FakeEnv(worker, sent)
    result = getattr(service, handler)(payload, env)
    if result is not None:
        sent.log.append((worker, result[0], result[1]))


def push(step: int) -> tuple[int, dict[str, Any], int, float]:
    return (step, {"w": np.ones(4, dtype=np.float32)}, 8, 0.001)


def test_a_release_answers_remote_workers_before_the_one_on_the_shards_node() -> None:
    service, _, sent = shard([HERE, FAR])
    call(service, sent, HERE, "join", (0, 0))
    call(service, sent, FAR, "join", (0, 1))   # the start barrier opens: both go
    assert [w for w, _, _ in sent.log] == [FAR, HERE]
    sent.log.clear()
    call(service, sent, HERE, "push", push(1))   # held until the round is complete
    assert sent.log == []
    call(service, sent, FAR, "push", push(1))
    assert sent.log == [(FAR, Status.GO, 1), (HERE, Status.GO, 1)]
    sent.log.clear()
    call(service, sent, FAR, "push", push(2))
    call(service, sent, HERE, "push", push(2))   # the local worker completes the round
    assert sent.log == [(FAR, Status.GO, 2), (HERE, Status.GO, 2)]


def test_a_departure_releases_remote_workers_first() -> None:
    service, ctx, sent = shard([HERE, FAR, GONE])
    for slot, w in enumerate([HERE, FAR, GONE]):
        call(service, sent, w, "join", (0, slot))
    sent.log.clear()
    call(service, sent, HERE, "push", push(1))
    call(service, sent, FAR, "push", push(1))
    assert sent.log == []   # GONE has not pushed: BSP holds both
    for listener in ctx.listeners:
        listener(NodeEvent(NodeEventKind.DEAD, GONE, "worker"))
    assert sent.log == [(FAR, Status.GO, 1), (HERE, Status.GO, 1)]

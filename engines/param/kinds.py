"""This engine's own message kinds and the records they carry (the core routes on
``(service, kind)`` and never lists them).

One step of a worker is one PUSH request to each server shard and one reply from each: the
reply is deferred while the barrier holds the worker and carries the fresh values when it
lets it go, so no control message is ever added to the step.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from actorpy.ids import NodeId
from engines.param import packing


class ParamKind(IntEnum):
    """Messages to a server shard, and (SHARDS, CANCEL) to the job's conductor on the
    driver."""

    JOIN = 1      # worker -> shard: enter the barrier; reply: Reply (deferred at the start)
    PUSH = 2      # worker -> shard: Push; reply: Reply, deferred until the barrier allows
    HALT = 4      # conductor -> shard: stop (now, or once every worker reached a step)
    MODEL = 5     # driver -> shard: the shard's keys -> values (halts first if asked to)
    STATS = 6     # driver/tests -> shard: steps table and counters
    SHARDS = 7    # worker -> conductor: the shard refs, once newer than a generation
    CANCEL = 8    # Run.cancel -> conductor (cast): stop the job now
    ABORT = 9     # conductor -> shard: the job failed (or timed out, was cancelled): stop now


class Status(IntEnum):
    """What a reply tells a worker to do next."""

    GO = 0        # compute the next step with these values
    FINISH = 1    # the job reached its stop condition (or the driver collects it): return
    RELEASED = 2  # this worker was released as a persistent straggler: return
    HALTED = 3    # the job failed, timed out or was cancelled (ABORT): return


@dataclass(frozen=True, slots=True)
class Push:
    """A worker's step: ``step`` steps completed, updates for this shard's keys.

    On the wire it is the plain tuple ``(step, packed updates, batch, compute_s)`` the
    worker builds (``Push.of(payload)`` on the shard): a tuple pickles in half the time of
    a dataclass, and this message is sent on every step. ``groups``: the updates' packed
    groups (``packing.unpack``), for the shard's checks and averages by group.
    """

    step: int
    updates: dict[str, Any]
    batch: int
    compute_s: float
    groups: tuple[Any, ...] = ()

    @classmethod
    def of(cls, payload: tuple[int, Any, int, float]) -> Push:
        step, packed, batch, compute_s = payload
        updates, groups = packing.unpack(packed)
        return cls(step, updates, batch, compute_s, groups)


@dataclass(frozen=True, slots=True)
class Reply:
    """A shard's answer to JOIN or PUSH."""

    status: Status
    step: int = 0
    values: dict[str, Any] | None = None
    batch: int | None = None      # a new batch size (LB-BSP), None to keep the current one
    stopped_at: int | None = None  # FINISH: the shard's step when it stopped

    def wire(self, packed: dict[int, Any] | None = None) -> tuple[int, int, Any, int | None,
                                                                   int | None]:
        """A plain tuple for the wire (an IntEnum would pickle as a call), the values packed
        (``packing.pack``; ``packed`` caches them by the values dict's id, for answers
        sharing one)."""
        values = self.values
        if packed is None:
            wired = packing.pack(values)
        elif id(values) in packed:
            wired = packed[id(values)]
        else:
            wired = packed[id(values)] = packing.pack(values)
        return (int(self.status), self.step, wired, self.batch, self.stopped_at)



@dataclass(frozen=True, slots=True)
class Join:
    """A worker entering a shard's barrier with ``step`` steps already completed."""

    worker: NodeId
    step: int
    slot: int

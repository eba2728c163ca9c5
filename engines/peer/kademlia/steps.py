"""The last step each peer reported, read off the messages it sent anyway.

Every overlay message carries its sender's completed steps (``step``, -1 outside a job). A
node notes them here with the time it heard them, so a barrier can decide from what it
already knows and ask (PING) only the peers whose last known step would block it. Steps only
grow, so an old entry is a lower bound: if it already lets us pass, it still does.

>>> table = StepTable()
>>> table.observe(KadId(7), "a", step=3, now=1.0), table.observe(KadId(7), "a", 2, now=2.0)
(True, False)
>>> table.get(KadId(7))
StepSeen(step=3, seen_at=2.0, address='a')
"""
from __future__ import annotations

from dataclasses import dataclass

from .ids import KadId

#: the step a peer whose job ended for it reports (its ``stop`` said so): it will not move
#: again, so nobody waits on it (a barrier would wait forever), and it is no step to catch
#: up with or to balance against
FINISHED = (1 << 63) - 1


@dataclass(frozen=True)
class StepSeen:
    """What we know of a peer's progress.

    Attributes:
        step: the highest step it reported (messages may arrive out of order).
        seen_at: when we last heard from it (any message), on the node's clock.
        address: where it was heard from.
    """

    step: int
    seen_at: float
    address: str


class StepTable:
    """Peer id -> ``StepSeen``, fed by ``observe`` for every accepted message."""

    def __init__(self) -> None:
        self._seen: dict[int, StepSeen] = {}
        self._ids: dict[str, int] = {}
        self.advances = 0            # how many times some peer's known step went up

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._seen

    def observe(self, node_id: KadId, address: str, step: int, now: float) -> bool:
        """Note a message from ``node_id`` reporting ``step``; True if its step went up."""
        old = self._seen.get(node_id)
        self._ids[address] = node_id
        if old is None or step > old.step:
            self._seen[node_id] = StepSeen(step, now, address)
            self.advances += 1
            return True
        self._seen[node_id] = StepSeen(old.step, max(now, old.seen_at), address)
        return False

    def hear_of(self, node_id: KadId, step: int) -> None:
        """Another peer says ``node_id`` reached ``step`` (second-hand): a lower bound, so it
        may raise the step but says nothing about when the peer was last heard from."""
        old = self._seen.get(node_id)
        if old is None:
            self._seen[node_id] = StepSeen(step, float("-inf"), "")
            self.advances += 1
        elif step > old.step:
            self._seen[node_id] = StepSeen(step, old.seen_at, old.address)
            self.advances += 1

    def digest(self, limit: int, exclude: int | None = None) -> tuple[tuple[KadId, int], ...]:
        """The ``limit`` most recently heard first-hand entries, as (id, step) pairs."""
        heard = [(s.seen_at, i, s.step) for i, s in self._seen.items()
                 if i != exclude and s.seen_at != float("-inf")]
        heard.sort(reverse=True)
        return tuple((KadId(i), step) for _, i, step in heard[:limit])

    def get(self, node_id: int) -> StepSeen | None:
        """What we know of ``node_id``, if anything."""
        return self._seen.get(node_id)

    def at(self, address: str) -> StepSeen | None:
        """What we know of the peer heard from at ``address``."""
        node_id = self._ids.get(address)
        return None if node_id is None else self._seen.get(node_id)

    def forget(self, node_id: int) -> None:
        """The peer died or left."""
        seen = self._seen.pop(node_id, None)
        if seen is not None and self._ids.get(seen.address) == node_id:
            del self._ids[seen.address]

    def items(self) -> list[tuple[int, StepSeen]]:
        """Every peer heard from, with its entry."""
        return list(self._seen.items())

"""How many replication rounds a key's owner has in flight at once (``KeyOwner`` is one of
these), and which holders a round skips.

An owner answers another peer's push once a round of STOREs holding its write was taken by
the key's holders, one round in flight per key; writes made meanwhile go with the next. A
step of many keys started a round per push at once: ~3.7 rounds per key and step on 4
peers, hundreds of STOREs landing in each holder's inbox together, where they waited past
their timeouts and got live holders evicted (docs/peer.md, "Many keys"). So an owner keeps
at most ``MAX_ROUNDS`` rounds in flight (all keys); a key whose round would start beyond
that waits, in order, until one ends, and the pushes of that key arriving meanwhile go with
it: one round for several pushes. Below the cap nothing changes (a round starts at once).
"""
from __future__ import annotations

from typing import Any, Callable

from .kademlia.events import Effects
from .kademlia.ids import KadId
from .kademlia.node import KademliaNode

#: the most replication rounds one owner has in flight, all keys together (a round's
#: STOREs go to the key's 1-2 other holders; nodes cap their requests per contact at
#: ``max_in_flight``, 32, besides: beyond it they only queued, none coalesced)
MAX_ROUNDS = 4


class RoundWindow:
    """``KeyOwner``'s cap on rounds in flight (it provides ``node``, ``_replicating``,
    ``_copies``, ``_waiting`` and ``_replicate``)."""

    node: KademliaNode
    _replicating: dict[int, int]
    _copies: dict[int, dict[int, int]]
    _waiting: dict[int, list[tuple[int, int, Any]]]
    _replicate: Callable[[KadId, float, Effects], None]

    def _init_rounds(self) -> None:
        self._deferred: dict[int, None] = {}    # keys whose round waits for room, in order
        self._starting: int | None = None       # the one ``_next_rounds`` starts now

    def _defer(self, kid: KadId) -> bool:
        """Whether ``kid``'s round waits for room (queued once, behind those waiting
        already: a key whose round ended dirty goes after them); False: start it now."""
        if kid == self._starting:
            return False
        if kid not in self._deferred and not self._deferred \
                and len(self._replicating) < MAX_ROUNDS:
            return False
        self._deferred[kid] = None
        return True

    def _next_rounds(self, now: float, eff: Effects) -> None:
        """A round ended: start the rounds waiting for room, oldest first."""
        while self._deferred and len(self._replicating) < MAX_ROUNDS:
            kid = next(iter(self._deferred))
            del self._deferred[kid]
            self._starting = kid
            try:
                self._replicate(KadId(kid), now, eff)
            finally:
                self._starting = None

    def _skip(self, kid: KadId, clock: int, now: float) -> frozenset[int]:
        """The holders a round at ``clock`` need not STORE to: each holds ``clock`` already
        (``_copies``) or has a push waiting on the round, whose answer it keeps as its copy
        (``PeerRunner._keep_copy``, behind ``fenced``). Never every holder: some holder's
        fence judges every round, so a stale owner learns it from a refusal."""
        holders = self.node.holders_of(kid, now)
        copies = self._copies.get(kid)
        if not holders or not copies:
            return frozenset()
        pushing = {pusher for _, pusher, _ in self._waiting.get(kid, [])}
        skip = [h.node_id for h in holders if h.node_id in copies
                and (copies[h.node_id] >= clock or h.node_id in pushing)]
        if len(skip) == len(holders):
            skip.pop()
        return frozenset(skip)

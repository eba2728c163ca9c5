"""The peers a node evicted lately, which may only have been slow: whether one is gone, whether
the node is alone, and PINGing them again (``KademliaNode`` is one of these)."""
from __future__ import annotations

from .events import Effects, KademliaConfig
from .ids import KadId
from .routing import Contact, RoutingTable
from .sizes import ValueSizes


class GonePeers:
    """``KademliaNode``'s view of the peers it evicted (it provides the fields below and
    ``_probe``)."""

    config: KademliaConfig
    node_id: KadId
    routing: RoutingTable
    sizes: ValueSizes
    _dead: dict[int, float]
    _left: set[int]
    _evicted: dict[int, Contact]
    _recheck_at: dict[int, float]

    def _probe(self, contact: Contact, now: float, eff: Effects) -> int | None:
        raise NotImplementedError

    def _is_dead(self, node_id: int, now: float) -> bool:
        raise NotImplementedError

    def is_gone(self, node_id: int, now: float) -> bool:
        """Whether ``node_id`` left or was found dead lately (evicted, not yet heard from)."""
        return self._is_dead(node_id, now)

    def alone(self, now: float) -> bool:
        """Whether this node knows no other peer: none in its table, none gone lately (a
        table emptied by false evictions is not alone: those peers live, may hold newer
        copies, and come back within a second or so; one killed for good stays away)."""
        return not len(self.routing) and not any(self.lately_gone(n, now) for n in self._dead)

    def lately_gone(self, node_id: int, now: float) -> bool:
        """Whether ``node_id`` was evicted (not left) within 10 x ``rpc_timeout_s`` and twice
        its largest value's move (``sizes.LinkPace.behind_s``)."""
        lately = 10 * self.config.rpc_timeout_s + 2 * self.sizes.behind_s(self.config, node_id)
        return self.gone_within(node_id, now, lately)

    def gone_within(self, node_id: int, now: float, seconds: float) -> bool:
        """Whether ``node_id`` was evicted (not left) within the last ``seconds``."""
        until = self._dead.get(node_id)
        return until is not None and node_id not in self._left \
            and now < until - self.config.dead_for_s + seconds

    def evicted_within(self, now: float, seconds: float) -> list[Contact]:
        """The peers evicted (not left) within the last ``seconds``, of the last 64 evicted."""
        return [c for n, c in self._evicted.items() if self.gone_within(n, now, seconds)]

    def gone_closer(self, key: int, now: float) -> list[Contact]:
        """The peers gone lately (``lately_gone``) that are closer to ``key`` than we are."""
        return [c for n, c in self._evicted.items()
                if n ^ key < self.node_id ^ key and self.lately_gone(n, now)]

    def probe_lately(self, now: float, key: int | None = None,
                     within_s: float | None = None) -> Effects:
        """PING the peers gone lately (those closer to ``key``, if given; those evicted
        within ``within_s``, if given), each once per 10 x ``rpc_timeout_s`` at most: a
        table that lost every peer to a cut link finds them once it is mended (no lookup
        has a contact to start from), so an engine waiting for another holder gets one."""
        eff = Effects()
        for node_id, contact in self._evicted.items():
            gone = self.lately_gone(node_id, now) if within_s is None \
                else self.gone_within(node_id, now, within_s)
            if gone and now >= self._recheck_at.get(node_id, 0.0) \
                    and (key is None or node_id ^ key < self.node_id ^ key):
                self._recheck_at[node_id] = now + 10 * self.config.rpc_timeout_s
                self._probe(contact, now, eff)
        return eff

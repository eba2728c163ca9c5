"""Who may write a key: the fence of ``owner.py`` ("Fence" in its docstring), on the holder's
side (``accept_store``, the node's hook for STOREs) and on the pusher's (``fenced``)."""
from __future__ import annotations

from typing import Any

from .kademlia.events import Effects
from .kademlia.ids import KadId
from .kademlia.node import KademliaNode
from .kademlia.routing import Contact


class Fence:
    """``KeyOwner``'s checks of who owns a key (it provides ``node``, ``owned`` and
    ``_unsettled``)."""

    node: KademliaNode
    owned: set[int]

    def _unsettled(self, kid: KadId, now: float, eff: Effects) -> None:
        raise NotImplementedError

    def closest_known(self, kid: int) -> Contact | None:
        """The contact closest to ``kid`` in our table, suspects included (one that missed a
        reply still owns its keys until evicted, or each miss would move them and back)."""
        return self.node.routing.nearest(kid)     # asked per push served and answered

    def _is_owner(self, kid: KadId) -> bool:
        return not self._closer_known(kid, self.node.node_id)

    def _closer_known(self, kid: int, node_id: int) -> bool:
        """Whether we know a peer closer to ``kid`` than ``node_id``, ourselves included."""
        distance = node_id ^ kid
        if self.node.node_id ^ kid < distance:
            return True
        closest = self.closest_known(kid)
        return closest is not None and closest.node_id ^ kid < distance

    def accept_store(self, sender: Contact, store: Any, now: float, eff: Effects) -> bool:
        """The fence (module docstring): refuse an owner's write when we know a peer closer
        to the key than that owner, ourselves included, or when our copy is another
        writer's and newer than the root of that owner's branch (``Store.base``). A copy
        taken that replaces the one we serve the key from makes us take it over again
        (``replaced``)."""
        held = self.node.storage.get(store.key, now)
        taken = self._admits(sender, store, now, eff)
        if taken and (held is None or (store.clock, store.writer) > held.version):
            self.replaced(store.key, now, eff)
        return taken

    def replaced(self, kid: KadId, now: float, eff: Effects) -> None:
        """Another copy replaced ours of ``kid`` (a STORE taken, an answer kept as our copy).
        If we serve the key, what we know of our copy (each pusher's last step folded into
        it, its stamps; the copies its holders have) is of the one we took over, not this
        one: the key is taken over again (this copy's stamps with it) before it is served
        again, and our own updates not confirmed yet are pushed again. (Served from that
        copy, a push it holds already, which another owner folded, answered late, was
        folded again: two owners at once, each having evicted the other, on a loaded
        machine.)"""
        if kid in self.owned:
            self.owned.discard(kid)
            self._unsettled(kid, now, eff)

    def _admits(self, sender: Contact, store: Any, now: float, eff: Effects) -> bool:
        if store.clock == 0 or store.writer != sender.node_id:
            return True             # a seed, a hand-off or a copy passed on: not a new write
        if self._closer_known(store.key, sender.node_id):
            return False
        held = self.node.storage.get(store.key, now)
        if held is not None and held.writer == self.node.node_id and store.clock > held.clock:
            # our own branch, owned while cut off from this closer owner, loses: our own
            # updates on it go to that owner now (with their steps)
            self.owned.discard(store.key)
            self._unsettled(store.key, now, eff)
            return True
        if held is None or store.base < 0 or held.writer in (store.writer, 0):
            return True
        # two owners at once (each evicted the other): taking it loses our copy's writes.
        # (At its root's clock, another writer's copy is that root most often: each owner
        # that takes a key over stores the copy it took under its own name.)
        return held.clock <= store.base

    def fenced(self, owner: Contact, kid: KadId) -> bool:
        """The fence on the pusher's side: whether an answer to our push from ``owner`` is a
        stale owner's (we know a peer closer to ``kid``, ourselves included): a holder keeps
        it as the copy a skipped STORE would have brought; the runner takes it as NOT_OWNER."""
        return self._closer_known(kid, owner.node_id)

"""When a key's owner waits rather than act at once (``KeyOwner`` is one of these): before
taking a key over again after a holder refused its round (``_holding``), and before settling
its own updates on a round no other peer took (``_awaits_partner``): in both, a peer it
evicted may be slow or cut off rather than dead."""
from __future__ import annotations

from typing import Any, Callable

from .context import JobSpec
from .kademlia.events import Done, Effects
from .kademlia.ids import KadId
from .kademlia.node import KademliaNode

Then = Callable[[Done, float, Effects], None]
StartOp = Callable[[tuple[int, Effects], Then, Effects], None]


class OwnerWaits:
    """``KeyOwner``'s waits (it provides the fields below, ``_start_op`` and
    ``_replicate_later``)."""

    spec: JobSpec
    node: KademliaNode
    _start_op: StartOp
    # the waits' state (``KeyOwner.__init__`` says what each holds)
    _refused: dict[int, bool]
    _looking: set[int]
    _awaiting: dict[int, float]
    _unsure: dict[int, list[tuple[int, str, int, Any]]]

    def _replicate_later(self, kid: KadId, eff: Effects, delay_s: float | None = None) -> None:
        raise NotImplementedError

    def _holding(self, kid: KadId, now: float, eff: Effects) -> bool:
        """Whether to wait before taking ``kid`` over. While a peer closer to it that we
        evicted lately (``lately_gone``: 10 rpc timeouts) may be alive, slow rather than
        dead, it is PINGed and the key is not ours: it is that peer's again once it
        answers (``_is_owner``), ours once it stays silent that long. (Taken over at once,
        a live owner's key had two owners, each with rounds durable on the holders that
        had not evicted it; when the branches met the fences one was dropped with updates
        already acknowledged: with a 2 ms rpc timeout, 8 of 30 simulated seeds lost one.)
        After a holder refused our round (it knows a peer closer to the key than us, or a
        newer copy's writer), a lookup of the key first finds the closer peers the holders
        know. (Taken over again at once, the key was refused again: a peer that did not
        know the owner took it over 27 times in 0.4 s, each time fetching the copy.)"""
        if self.node.gone_closer(kid, now):
            eff.extend(self.node.probe_lately(now, kid))
            return True
        looked = self._refused.get(kid)
        if looked is None:
            return False
        if looked:
            del self._refused[kid]
            return False
        if kid not in self._looking:
            self._looking.add(kid)

            def found(done: Done, when: float, e: Effects) -> None:
                self._looking.discard(kid)
                if kid in self._refused:
                    self._refused[kid] = True
            self._start_op(self.node.find_node(kid, now), found, eff)
        return True

    def _awaits_partner(self, kid: KadId, shared: bool, now: float, eff: Effects) -> bool:
        """Whether our own updates on ``kid`` stay unsure after a durable round that no other
        peer took (``shared`` False: this peer is alone, every peer it knew evicted): for
        ``wait_alone_s`` from the first such round those peers are PINGed and the round goes
        again, in case they were cut off rather than dead. Once the link mends their branch
        may win, and these updates are then pushed to it again (``_unsettled``) where,
        settled, they were lost with our branch, and the job, its peers done, ended in the
        cut with a model per side. Peers that left (LEAVE) are not waited for."""
        evicted = self.node.evicted_within(now, self.node.config.dead_for_s)
        if shared or not self._unsure.get(kid) or not evicted:
            self._awaiting.pop(kid, None)
            return False
        if not self._awaits(kid, now):
            return False            # waited: they are dead (until a shared round, at once)
        eff.extend(self.node.probe_lately(now, within_s=self.node.config.dead_for_s))
        left = self._awaiting[kid] + self.spec.wait_alone_s - now
        self._replicate_later(kid, eff, min(10 * self.node.config.rpc_timeout_s, left))
        return True

    def _awaits(self, kid: KadId, now: float) -> bool:
        """Whether ``kid``'s own updates still wait for a partner (``_awaits_partner``)."""
        return now - self._awaiting.setdefault(kid, now) < self.spec.wait_alone_s

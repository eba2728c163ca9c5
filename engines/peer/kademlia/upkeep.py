"""Keeping keys alive: republish, re-replication when a holder dies, hand-off on leave.

Each key lives on its ``replication`` closest peers (paper 2.3, 2.5). Three things keep it
there as peers come and go:

* **republish** (every ``republish_interval_s``): holders re-store their keys on the current
  closest peers with the remaining TTL; the origin renews the TTL (the paper's rule).
* **re-replication**: when a node evicts a dead peer (or hears its LEAVE) it checks, for each
  key it holds, whether the gone peer was one of the key's ``replication`` closest; if so, it
  stores the key again on the current closest (a lookup, then STOREs), and once more if one
  of those STOREs goes unanswered (that peer died too). ``replica_check_s`` PINGs the other
  holders of our keys periodically so a death is noticed even when nobody was talking to
  the dead peer.
* **hand-off**: a node that leaves stores each key it holds on the closest *other* peers
  before it tells its contacts (LEAVE) that it is gone.

Versions travel with every copy, so a replica that missed updates takes the newest one.
``Upkeep`` works on its node's internals (lookups, requests, storage): it is the node's
part that is about keys rather than routing, kept in its own file.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .events import Effects, OpKind, Send
from .ids import KadId, short
from .messages import Leave

if TYPE_CHECKING:
    from .node import KademliaNode, _Op

log = logging.getLogger(__name__)

#: Operations that end with a STORE phase on the key's closest peers.
STORE_OPS = frozenset({OpKind.STORE, OpKind.REPUBLISH, OpKind.REPLICATE, OpKind.HANDOFF})


class Upkeep:
    """The key-keeping duties of one ``KademliaNode`` (see the module docstring)."""

    def __init__(self, node: KademliaNode) -> None:
        self._node = node
        self._replicating: set[int] = set()

    def republish(self, now: float, eff: Effects) -> None:
        """The periodic sweep: drop expired keys, re-store the ones due (paper 2.5)."""
        node = self._node
        node.storage.expire(now)
        for key, record in node.storage.due_for_republish(now, node.config.republish_interval_s):
            ttl = node.config.ttl_s if record.is_origin else record.expires_at - now
            if record.is_origin:
                node.storage.put(key, record.value, now, ttl, is_origin=True, clock=record.clock,
                                 writer=record.writer)
            node._begin(OpKind.REPUBLISH, key, now, eff=eff, value=record.value, ttl_s=ttl,
                        clock=record.clock, writer=record.writer)

    def peer_gone(self, gone: int, now: float, eff: Effects) -> None:
        """``gone`` was evicted (dead) or left: store again the keys it held with us."""
        node = self._node
        copies = node.config.copies
        for key in node.storage.keys():
            if node.storage.get(key, now) is None or key in self._replicating:
                continue
            gone_distance = gone ^ key
            closest = node.routing.closest(key, copies)
            nearer = sum(1 for c in closest if c.node_id ^ key < gone_distance)
            nearer += (node.node_id ^ key) < gone_distance
            if nearer >= copies:
                continue                    # it was not one of this key's holders
            # Every holder that notices does it (STOREs are idempotent, one REPLICATE per key
            # at a time): a copy outside the closest, such as the origin's, can then bring
            # back a key whose closest holders all died.
            log.debug("%s: re-replicating %s after %s went", short(node.node_id), short(key),
                      short(gone))
            self._replicate(KadId(key), now, eff)

    def _replicate(self, key: KadId, now: float, eff: Effects) -> None:
        node = self._node
        record = node.storage.get(key, now)
        if record is None:
            return
        self._replicating.add(key)
        node.stats.replicated += 1
        ttl = node.config.ttl_s if record.is_origin else record.expires_at - now
        node._begin(OpKind.REPLICATE, key, now, eff=eff, value=record.value, ttl_s=ttl,
                    clock=record.clock, writer=record.writer, then=self._replicated)

    def _replicated(self, op: _Op, now: float, eff: Effects) -> None:
        self._replicating.discard(op.target)
        if op.confirmed + len(op.refusals) < op.holders:
            # A peer it stored on died unanswered: the key is a copy short. Its eviction
            # came while this ran, so peer_gone left the key to this REPLICATE, and the
            # replica checks that follow ping only live peers: store again (the lookup
            # skips the evicted peer now).
            self._replicate(op.target, now, eff)

    def check_replicas(self, now: float, eff: Effects) -> None:
        """PING the closest peers of every key we hold (its other holders), once each."""
        node = self._node
        asked: set[int] = set()
        for key in node.storage.keys():
            if node.storage.get(key, now) is None:
                continue
            for contact in node.routing.closest(key, node.config.copies):
                if contact.node_id not in asked:
                    asked.add(contact.node_id)
                    node._probe(contact, now, eff)

    def leave(self, op: _Op, now: float, eff: Effects) -> None:
        """Hand every key to its closest other peers, then send LEAVE and finish ``op``."""
        node = self._node
        records = [(k, r) for k in node.storage.keys()
                   if (r := node.storage.get(k, now)) is not None]
        op.awaiting = len(records)
        if not records:
            self._announce(op, now, eff)
            return

        def handed(child: _Op, when: float, e: Effects) -> None:
            op.stored_on.extend(c for c in child.stored_on if c not in op.stored_on)
            op.awaiting -= 1
            if op.awaiting == 0:
                self._announce(op, when, e)

        for key, record in records:
            ttl = node.config.ttl_s if record.is_origin else record.expires_at - now
            node._begin(OpKind.HANDOFF, KadId(key), now, eff=eff, value=record.value,
                        ttl_s=ttl, clock=record.clock, writer=record.writer, exclude_self=True,
                        then=handed)

    def _announce(self, op: _Op, now: float, eff: Effects) -> None:
        node = self._node
        for contact in node.routing.contacts():
            eff.sends.append(Send(contact.address, Leave(0, node.node_id, node.step)))
        node.left = True                    # and silent from now on
        for key in node.storage.keys():
            node.storage.drop(key)          # handed on: serve no stale copy from here
        node._finish(op, now, eff)

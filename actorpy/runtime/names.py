"""Service names, kept by the manager: unique in the cluster, gone with their service.

Why the manager: every node already knows it and trusts what it says about membership, a
lookup is one round trip whatever the cluster's size, and a name must outlive neither its
service nor its node, which the manager is first to know (it declares nodes dead). Names
are unique per cluster; engines scope them per job with a prefix (``f"{job}/shard-3"``).

A host binds a name before constructing its service (so two starts with one name cannot
both succeed) and unbinds it when the service stops or dies; the manager drops every name
of a node that dies or leaves.
"""
from __future__ import annotations

import logging
from collections import defaultdict

from actorpy.errors import ServiceError, ServiceNameTaken
from actorpy.ids import NodeId
from actorpy.log import Throttle
from actorpy.runtime.context import ServiceRef
from actorpy.runtime.mailbox import MAX_SERVICE_ID
from actorpy.runtime.node import Node, NodeEvent, NodeEventKind
from actorpy.wire import message as wm
from actorpy.wire.kinds import CORE_SERVICE, Kind

log = logging.getLogger(__name__)
_DROPS = Throttle()     # malformed requests: a line per sender per 10 s


class NameRegistry:
    """Serves NAME_BIND / NAME_UNBIND / NAME_LOOKUP on the manager's node.

    A node can hold at most 65 535 names (one per service id it can run), so the table is
    bounded by the cluster's membership.
    """

    def __init__(self, node: Node) -> None:
        self.node = node
        self._refs: dict[str, ServiceRef] = {}
        self._by_node: dict[NodeId, set[str]] = defaultdict(set)
        node.on(CORE_SERVICE, Kind.NAME_BIND, self._bind)
        node.on(CORE_SERVICE, Kind.NAME_UNBIND, self._unbind)
        node.on(CORE_SERVICE, Kind.NAME_LOOKUP, self._lookup)
        self._subscription = node.subscribe(self._node_event)

    def _bind(self, msg: wm.Message) -> None:
        try:
            name, sid = msg.payload()
        except (TypeError, ValueError):
            self.node.reply_error(msg, ServiceError("NAME_BIND takes (name, service id)"))
            return
        owner = NodeId(msg.sender)
        if not isinstance(name, str) or not isinstance(sid, int) or not 0 < sid <= MAX_SERVICE_ID:
            self.node.reply_error(msg, ServiceError(f"bad service name binding {name!r}, {sid!r}"))
            return
        held = self._refs.get(name)
        if held is not None and (held.node, held.service) != (owner, sid):
            self.node.reply_error(msg, ServiceNameTaken(
                f"the service name {name!r} is taken by service {held.service} on {held.node}; "
                "stop that service first, or choose another name"))
        elif len(self._by_node[owner]) >= MAX_SERVICE_ID:
            self.node.reply_error(msg, ServiceError(f"node {owner} holds too many names"))
        else:
            ref = ServiceRef(owner, sid, name)
            self._refs[name] = ref
            self._by_node[owner].add(name)
            log.info("service name %r -> service %d on %s", name, sid, owner)
            self.node.reply(msg, ref)

    def _unbind(self, msg: wm.Message) -> None:
        try:
            name, sid = msg.payload()
        except (TypeError, ValueError):
            _DROPS.log(log, msg.sender, "dropped a malformed NAME_UNBIND from %s", msg.sender)
            return
        ref = self._refs.get(name)
        if ref is not None and ref.node == msg.sender and ref.service == sid:
            self._drop(name)

    def _lookup(self, msg: wm.Message) -> None:
        name = msg.payload()
        self.node.reply(msg, self._refs.get(name) if isinstance(name, str) else None)

    def _node_event(self, event: NodeEvent) -> None:
        if event.kind is not NodeEventKind.JOINED:
            for name in list(self._by_node.get(event.node_id, ())):
                self._drop(name)
            self._by_node.pop(event.node_id, None)

    def _drop(self, name: str) -> None:
        ref = self._refs.pop(name, None)
        if ref is not None:
            names = self._by_node.get(ref.node)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._by_node[ref.node]

    def names(self) -> dict[str, ServiceRef]:
        """Every name and its service (a copy)."""
        return dict(self._refs)

"""The ``Node``'s directory calls: which peers it knows and where they listen, the watched
links' verdicts (not listening, refused handshake), marking nodes dead and the membership
events that follow.

``NodePeers`` is a part of ``actorpy.runtime.node.Node`` (a mixin with no state of its
own): the peers, links and dead live in its ``directory.Directory``, the requests these
calls fail in its ``requests.RequestTable``.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from actorpy.errors import AuthError, NodeLost
from actorpy.ids import NodeId
from actorpy.runtime.directory import Directory
from actorpy.runtime.events import NodeEvent, NodeEventKind, Peer, Subscription
from actorpy.runtime.liveness import Verdict
from actorpy.runtime.requests import RequestTable

# Logged under the node's name, as before this part moved out of node.py.
log = logging.getLogger("actorpy.runtime.node")


class NodePeers:
    """Peers, links and membership of a ``Node`` (see ``actorpy.runtime.node``)."""

    _dir: Directory
    _requests: RequestTable
    _auth_failures: dict[NodeId, str]

    def add_peer(self, node_id: NodeId, address: str, role: str, slots: int = 1, *,
                 watch: bool = False) -> None:
        """Learn where a node listens; messages parked for it go out now, before any newer one.
        A node not known before is announced to subscribers as JOINED. With ``watch`` the
        link to it is opened now, with ZMTP heartbeats and a monitor (``link_down_for``).

        Raises:
            ConfigError: ``address`` is not an endpoint ZeroMQ can connect to.
        """
        self._dir.add_peer(node_id, address, role, slots, watch)

    def forget_peer(self, node_id: NodeId) -> None:
        """Drop a peer that was only passing by (e.g. a status client); what was sent to it
        may still flush for ``linger_ms``. Not a death: no listener hears of it."""
        self._dir.forget_peer(node_id)
        self._auth_failures.pop(node_id, None)

    def peers(self, role: str | None = None) -> list[Peer]:
        """Live peers (of ``role``)."""
        return self._dir.peers(role)

    def peer(self, node_id: NodeId) -> Peer | None:
        """What is known of ``node_id`` (also of a recently dead one)."""
        return self._dir.peer(node_id)

    def is_dead(self, node_id: NodeId) -> bool:
        return self._dir.is_dead(node_id)

    def link_down_for(self, node_id: NodeId) -> float | None:
        """Seconds the watched link to ``node_id`` has been down (0: up; None: not watched)."""
        return self._dir.link_down_for(node_id, time.monotonic())

    def link_ever_up(self, node_id: NodeId) -> bool:
        """Whether the watched link to ``node_id`` has completed a handshake yet."""
        return self._dir.link_ever_up(node_id)

    def expect_listeners_within(self, seconds: float) -> None:
        """Links watched from now on find nobody listening for ``seconds`` before that is
        their verdict (default ``liveness.REFUSED_GRACE_S``, 3 s): a member of an embedded
        cluster dials a manager process starting beside it, which on a loaded machine can
        take longer than that to bind (connect() then failed, "nothing is listening")."""
        self._dir.refused_grace_s = seconds

    def link_verdict(self, node_id: NodeId) -> Verdict | None:
        """What the watched link to ``node_id`` has proven, if anything (see liveness)."""
        return self._dir.verdict(node_id)

    def on_link_up(self, callback: Callable[[NodeId], None]) -> None:
        """Call ``callback(node_id)`` on the I/O thread whenever a watched link completes
        a handshake (the first time, and again after each reconnection)."""
        self._dir.on_link_up = callback

    def auth_failure(self, node_id: NodeId) -> str | None:
        """Why ``node_id`` refused our handshake (None: it did not, or it was forgotten)."""
        return self._auth_failures.get(node_id)

    def mark_dead(self, node_id: NodeId, reason: str = "", left: bool = False) -> None:
        """Forget a node: fail requests waiting on it and tell the subscribers (LEFT when it
        left on purpose, else DEAD)."""
        fresh, role = self._dir.mark_dead(node_id)
        self._auth_failures.pop(node_id, None)
        suffix = f": {reason}" if reason else ""
        never = fresh and not role   # never known here: not "lost while running" anything
        self._requests.fail_dest(node_id, lambda f: NodeLost(node_id, (
            f"no node {node_id} is known in this cluster{suffix}; {f.what} was not run (a "
            "typo, or a node that left long ago?)" if never
            else f"node {node_id} was lost while running {f.what}{suffix}")))
        if fresh:
            self._dir.events.publish(NodeEvent(NodeEventKind.LEFT if left else NodeEventKind.DEAD,
                                        node_id, role, reason))

    def subscribe(self, listener: Callable[[NodeEvent], None]) -> Subscription:
        """Call ``listener(event)`` for every membership change (JOINED, LEFT, DEAD).

        It runs on the thread that learned the news (usually the I/O thread), so it must be
        quick and never block; a listener that raises is logged and the others still run.
        """
        return self._dir.events.subscribe(listener)

    def on_node_lost(self, listener: Callable[[NodeId], None]) -> Subscription:
        """Call ``listener(node_id)`` whenever a node dies or leaves (see ``subscribe``)."""
        def lost(event: NodeEvent) -> None:
            if event.kind is not NodeEventKind.JOINED:
                listener(event.node_id)
        return self.subscribe(lost)

    def on_unknown_destination(self, callback: Callable[[NodeId], None]) -> None:
        """Called when a send targets a node whose address is not yet known."""
        self._dir.on_unknown = callback

    def _verdict(self, node_id: NodeId, verdict: Verdict, address: str) -> None:
        if verdict is Verdict.NOT_LISTENING:
            # Not recorded: the link's own watch forgets it once a handshake succeeds.
            log.info("%s", not_listening(node_id, address))
            self._requests.fail_dest(node_id, lambda f: NodeLost(
                node_id, not_listening(node_id, address)))
            return
        if verdict is Verdict.AUTH_FAILED:
            text = (f"authentication with {node_id} at {address} failed: it refused our CURVE "
                    "handshake, so the cluster secret differs; use the same secret on every "
                    "node")
        else:
            text = (f"authentication with {node_id} at {address} failed: it speaks another "
                    "security mechanism (CURVE on one side only?); check the address and "
                    "the secret")
        log.info("%s", text)  # whoever waits on it gets an AuthError saying the same
        self._auth_failures[node_id] = text
        self._requests.fail_dest(node_id, lambda f: AuthError(text))


def not_listening(node_id: NodeId, address: str) -> str:
    """What a request to ``node_id`` fails with when nothing listens at ``address``."""
    return (f"nothing is listening at {address} (connections to {node_id} are refused, or "
            "its host is unreachable)")

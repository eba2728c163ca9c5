"""A P2P engine peer as one sans-I/O object: its Kademlia node plus, in a job, its runner.

This is what a shell drives, exactly as it would drive a bare ``KademliaNode``:

    effects = peer.receive(sender_address, wire_tuple, now, frames)   # after authenticating
    effects = peer.on_timer(kind, token, now)                          # a SetTimer fell due

and then performs ``effects``: each ``Send`` goes out as ``rpc.encode(message)`` followed by the
frames of ``rpc.value_frames(message)``; each ``SetTimer`` is scheduled to call ``on_timer``
back with its ``kind`` and ``token``; the ``Done``s left in ``effects.done`` are the shell's own
operations (the runner's are routed to it here, never returned).

>>> import random
>>> from .kademlia.ids import KadId
>>> peer = Peer(KademliaNode(KadId(5), "p", rng=random.Random(0)))
>>> peer.receive("q", (5, 1, 9, (7).to_bytes(20, "big"), -1), now=0.0).sends[0].message.KIND.name
'PONG'
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from .kademlia.events import Effects, TimerKind
from .kademlia.node import KademliaNode
from .runner import PeerRunner, Timer


class Peer:
    """A node, and the job runner using it if any.

    Args:
        node: the peer's Kademlia node.
        runner: the job's runner on this peer (built on the same node), or None.
    """

    def __init__(self, node: KademliaNode, runner: PeerRunner | None = None) -> None:
        self.node = node
        self.runner = runner

    @property
    def address(self) -> str:
        return self.node.address

    def receive(self, sender_address: str, message: object, now: float,
                frames: Sequence[object] = (),
                perform: Callable[[Effects], None] | None = None) -> Effects:
        """Handle one message (see ``KademliaNode.receive``; raises ``ProtocolError`` the
        same way, with nothing changed).

        ``perform``: the shell's, to have the message's own effects (an answer to a push,
        mostly) performed before a blocked barrier checks again and perhaps begins the next
        step; the effects of that are returned. Without it, everything is returned at once
        and a step the check begins starts from a timer due at once, after the answer."""
        advances = self.node.steps.advances
        eff = self.node.receive(sender_address, message, now, frames)
        if self.runner is None or self.node.steps.advances <= advances or self.node.left:
            return self.route(eff, now)
        # some peer made progress: a blocked barrier checks again (and PSP draws a fresh
        # sample), as a PS worker re-checks each time some worker pushes (papers.md)
        if perform is None:
            eff.extend(self.runner.peer_advanced(now))
            return self.route(eff, now)
        perform(self.route(eff, now))
        return self.route(self.runner.peer_advanced(now, answered=True), now)

    def on_timer(self, kind: Any, token: int, now: float) -> Effects:
        """A timer from an earlier ``SetTimer`` is due (the node's or the runner's)."""
        if isinstance(kind, TimerKind):
            return self.route(self.node.on_timer(kind, token, now), now)
        assert isinstance(kind, Timer) and self.runner is not None
        if self.node.left:
            # silent after its LEAVE, as its node is: anything a runner's timer sent now (a
            # retry, a replication round) would put this peer back in its receivers' tables
            return Effects()
        return self.route(self.runner.on_timer(kind, token, now), now)

    def leave(self, now: float) -> tuple[int, Effects]:
        """Leave gracefully: the runner stops for good (``PeerRunner.stop``), then the node
        hands its keys on and says LEAVE (``KademliaNode.leave``); nothing is sent after
        that. Ends in the node's LEAVE ``Done``."""
        if self.runner is not None:
            self.runner.stop()
        op_id, eff = self.node.leave(now)
        return op_id, self.route(eff, now)

    def route(self, eff: Effects, now: float) -> Effects:
        """Hand the runner the ``Done``s of its operations (which may start more), until only
        the shell's own are left."""
        runner = self.runner
        if runner is None or not eff.done:
            return eff
        out = Effects(sends=eff.sends, timers=eff.timers)
        queue = list(eff.done)
        while queue:
            done = queue.pop(0)
            if runner.owns(done.op_id):
                more = runner.on_done(done, now)
                out.sends.extend(more.sends)
                out.timers.extend(more.timers)
                queue.extend(more.done)
            else:
                out.done.append(done)
        return out

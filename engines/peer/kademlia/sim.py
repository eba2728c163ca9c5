"""A simulated network: N ``KademliaNode``s in one process on a virtual clock.

The in-memory transport delivers each message after a seeded random latency, drops a seeded
fraction, and drops everything to or from killed nodes. Time is a ``FakeClock``: nothing
sleeps, so thousands of nodes join in seconds. This is the thinnest possible shell around the
sans-I/O node, and the model for the runtime's: apply ``Effects``, feed messages and timers.

>>> net = SimNetwork(seed=1)
>>> addresses = net.grow(30)
>>> done = net.find_node(addresses[0], net.nodes[addresses[7]].node_id)
>>> done.contacts[0].address == addresses[7], len(done.contacts)
(True, 20)
"""
from __future__ import annotations

import heapq
import logging
import random
from typing import Any, Callable, Protocol, Sequence

from actorpy.clock import FakeClock
from actorpy.errors import ActorpyTimeout, ProtocolError

from .events import Done, Effects, KademliaConfig
from .ids import KadId, random_id
from .node import KademliaNode
from .routing import Contact
from .rpc import encode, value_frames

log = logging.getLogger(__name__)

StartOp = Callable[[KademliaNode, float], "tuple[int, Effects]"]


class Endpoint(Protocol):
    """What the simulator drives at an address: a ``KademliaNode``, or an engine's peer that
    wraps one (and answers the same two calls)."""

    def receive(self, sender_address: str, message: object, now: float,
                frames: Sequence[object] = ()) -> Effects: ...

    def on_timer(self, kind: Any, token: int, now: float) -> Effects: ...


class SimNetwork:
    """N nodes exchanging the protocol's messages in memory.

    Args:
        config: every node's ``KademliaConfig``.
        seed: seeds node ids, latencies, losses and every node's rng.
        latency_s: one-way latency, uniform in ``(low, high)`` virtual seconds.
        loss: probability that a message is dropped.
        wire: round-trip every message through ``rpc.encode`` / ``decode``, its value frames
            copied as a network would (slower; checks the codec end to end).
        clock: the virtual clock (a fresh ``FakeClock`` by default).
    """

    def __init__(self, config: KademliaConfig | None = None, *, seed: int = 0,
                 latency_s: tuple[float, float] = (0.005, 0.05), loss: float = 0.0,
                 wire: bool = False, clock: FakeClock | None = None) -> None:
        self.config = config or KademliaConfig()
        self.clock = clock or FakeClock()
        self.latency_s = latency_s
        self.loss = loss
        self.wire = wire
        self._rng = random.Random(seed)
        self.nodes: dict[str, KademliaNode] = {}
        self.endpoints: dict[str, Endpoint] = {}
        self.alive: set[str] = set()
        self.results: dict[tuple[str, int], Done] = {}
        self.delivered = 0
        self.dropped = 0
        self.rejected = 0

    # ------------------------------------------------------------ membership
    def add_node(self, node_id: KadId | None = None) -> str:
        """Create a node (not yet joined) and arm its timers; returns its address."""
        address = f"n{len(self.nodes)}"
        node_id = random_id(self._rng) if node_id is None else node_id
        node = KademliaNode(node_id, address, self.config,
                            rng=random.Random(self._rng.getrandbits(64)), now=self.clock.now())
        self.nodes[address] = node
        self.endpoints[address] = node
        self.alive.add(address)
        self._apply(address, node.start(self.clock.now()))
        return address

    def attach(self, address: str, endpoint: Endpoint) -> None:
        """Deliver ``address``'s messages and timers to ``endpoint`` (which wraps its node)."""
        self.endpoints[address] = endpoint

    def apply(self, address: str, effects: Effects) -> None:
        """Perform effects that ``address`` produced outside a delivery or a timer."""
        self._apply(address, effects)

    def join(self, address: str, via: str | None) -> Done | None:
        """Join ``address`` through ``via`` (None: the first node, nothing to do)."""
        if via is None:
            return None
        contact = self.contact(via)
        return self.run_op(address, lambda node, now: node.join([contact], now))

    def grow(self, n: int) -> list[str]:
        """Add ``n`` nodes one after another, each joining through a random live node."""
        added = []
        for _ in range(n):
            live = sorted(self.alive, key=lambda a: int(a[1:]))
            via = self._rng.choice(live) if live else None
            address = self.add_node()
            self.join(address, via)
            added.append(address)
        return added

    def kill(self, address: str) -> None:
        """Fail-stop a node: it neither sends, receives nor fires timers from now on."""
        self.alive.discard(address)

    def leave(self, address: str) -> Done:
        """Graceful exit: the node hands its keys on and says LEAVE, then stops."""
        done = self.run_op(address, lambda node, now: node.leave(now))
        self.kill(address)
        self.run_for(self.latency_s[1])     # its LEAVE messages land
        return done

    def kill_fraction(self, fraction: float, rng: random.Random,
                      keep: frozenset[str] = frozenset()) -> list[str]:
        """Kill ``fraction`` of the live nodes (never those in ``keep``); returns them."""
        live = sorted(self.alive - keep, key=lambda a: int(a[1:]))
        victims = rng.sample(live, int(round(fraction * len(self.alive))))
        for address in victims:
            self.kill(address)
        return victims

    def contact(self, address: str) -> Contact:
        """The contact of the node at ``address``."""
        return Contact(self.nodes[address].node_id, address)

    def true_closest(self, target: int, n: int, exclude: str | None = None) -> list[Contact]:
        """Brute force: the ``n`` live nodes closest to ``target``."""
        ids = ((self.nodes[a].node_id, a) for a in self.alive if a != exclude)
        return [Contact(i, a) for i, a in heapq.nsmallest(n, ids, key=lambda p: p[0] ^ target)]

    # ------------------------------------------------------------ operations
    def run_op(self, address: str, start: StartOp, max_s: float = 600.0) -> Done:
        """Start an operation on a node and run virtual time until its ``Done`` arrives.

        Raises:
            ActorpyTimeout: no ``Done`` within ``max_s`` virtual seconds.
        """
        node = self.nodes[address]
        op_id, effects = start(node, self.clock.now())
        self._apply(address, effects)
        return self.wait_for(address, op_id, max_s)

    def wait_for(self, address: str, op_id: int, max_s: float = 600.0) -> Done:
        """Run virtual time until the ``Done`` of ``address``'s operation ``op_id`` arrives.

        Raises:
            ActorpyTimeout: no ``Done`` within ``max_s`` virtual seconds.
        """
        key = (address, op_id)
        deadline = self.clock.now() + max_s
        while key not in self.results:
            due = self.clock.next_due()
            if due is None or due > deadline:
                raise ActorpyTimeout(f"operation {op_id} on {address} did not finish "
                                     f"within {max_s} virtual seconds")
            self.clock.run_until(due)
        return self.results.pop(key)

    def find_node(self, address: str, target: KadId) -> Done:
        """FIND_NODE lookup of ``target`` from ``address``."""
        return self.run_op(address, lambda node, now: node.find_node(target, now))

    def get(self, address: str, key: KadId, newest: bool = False) -> Done:
        """FIND_VALUE of ``key`` from ``address`` (``Done.value`` is None when not found)."""
        return self.run_op(address, lambda node, now: node.get(key, now, newest))

    def set(self, address: str, key: KadId, value: Any, ttl_s: float | None = None,
            clock: int | None = None) -> Done:
        """Store ``value`` under ``key`` from ``address`` (see ``KademliaNode.set``)."""
        return self.run_op(address, lambda node, now: node.set(key, value, now, ttl_s, clock))

    def sample_peers(self, address: str, beta: int, rng: random.Random) -> list[Contact]:
        """``beta`` peers sampled through the overlay by the node at ``address``."""
        done = self.run_op(address, lambda node, now: node.sample_peers(beta, rng, now))
        return list(done.contacts)

    def run_for(self, seconds: float) -> None:
        """Advance virtual time, delivering messages and firing every node's timers."""
        self.clock.advance(seconds)

    # ------------------------------------------------------------ transport
    def _apply(self, address: str, effects: Effects) -> None:
        clock = self.clock
        if address not in self.alive:
            self.dropped += len(effects.sends)
            return
        for send in effects.sends:
            if self.loss and self._rng.random() < self.loss:
                self.dropped += 1
                continue
            low, high = self.latency_s
            delay = low + (high - low) * self._rng.random()
            if self.wire:       # what a network delivers: plain values and copied frames
                payload: object = encode(send.message)
                frames: tuple[object, ...] = tuple(bytes(f) for f in value_frames(send.message))
            else:
                payload, frames = send.message, ()
            clock.call_later(delay, lambda s=address, d=send.address, p=payload, f=frames:
                             self._deliver(s, d, p, f))
        for timer in effects.timers:
            clock.call_later(timer.delay_s, lambda k=timer.kind, t=timer.token:
                             self._fire(address, k, t))
        for done in effects.done:
            self.results[(address, done.op_id)] = done

    def _deliver(self, src: str, dst: str, payload: object, frames: tuple[object, ...]) -> None:
        if dst not in self.alive:     # what was sent before the sender died still arrives
            self.dropped += 1
            return
        self.delivered += 1
        try:
            effects = self.endpoints[dst].receive(src, payload, self.clock.now(), frames)
        except ProtocolError as exc:
            self.rejected += 1
            log.warning("%s rejected a message from %s: %s", dst, src, exc)
            return
        self._apply(dst, effects)

    def _fire(self, address: str, kind: Any, token: int) -> None:
        if address in self.alive:
            self._apply(address, self.endpoints[address].on_timer(kind, token, self.clock.now()))

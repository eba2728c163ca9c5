"""A P2P job on N peers in this process: ``SimNetwork`` transport, ``FakeClock`` time.

Every peer is a ``Peer`` (node + runner) exactly as a real shell would drive it; only the
transport and the clock are simulated (seeded latency and loss, optional wire round-trips,
simulated compute times for stragglers). Peers can be killed, added or made to leave at
chosen virtual times, so failure and membership behaviour is tested without processes.

>>> import numpy as np
>>> from engines.peer.job import Job
>>> job = Job("count", seed=1)
>>> _ = job.register_schedule(lambda ctx: ["n"])
>>> _ = job.register_push(lambda ctx, values: {"n": np.ones(1)})
>>> _ = job.register_pull(lambda store, up: store.set("n", store.get("n")[0] + up["n"]))
>>> _ = job.register_stop(lambda ctx: ctx.step >= 5)
>>> result = job.simulate(peers=4, init={"n": np.zeros(1)})
>>> result.model["n"].tolist(), result.updates, sorted(result.steps.values())
([20.0], 20, [5, 5, 5, 5])
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from actorpy.errors import ActorpyTimeout, ProtocolError, RemoteError

from .barrier import CheckRecord
from .context import check_run
from .kademlia.events import Effects
from .kademlia.ids import KadId, key_id
from .kademlia.sim import SimNetwork
from .peer import Peer
from .runner import Phase, PeerRunner


@dataclass
class SimResult:
    """What a simulated run ends with.

    Attributes:
        model: key -> final value, read from the overlay. clocks: key -> its final clock.
        steps: peer address -> steps it completed (killed peers: when they died).
        seconds: virtual time from the start until every live peer stopped.
        updates: pushes folded in by owners, over all keys.
        owners: key -> addresses of the peers that ran ``pull`` for it.
        records: peer address -> its barrier decisions.
        truth: (record, true steps of the peers it saw at that instant), every decision.
        spreads: (time, min, max) of the working peers' steps, sampled every ``trace_s``.
        messages: messages delivered.
    """

    model: dict[str, Any]
    clocks: dict[str, int]
    steps: dict[str, int]
    seconds: float
    updates: int
    owners: dict[str, set[str]]
    records: dict[str, list[CheckRecord]]
    truth: list[tuple[CheckRecord, dict[str, int]]] = field(default_factory=list)
    spreads: list[tuple[float, int, int]] = field(default_factory=list)
    messages: int = 0


class SimRun:
    """A job on simulated peers.

    Args:
        job: the ``peer.Job``.
        peers: how many peers start the job.
        init: key -> initial value, stored (clock 0) before anyone starts.
        data: ``data(index)`` -> what peer ``index`` finds in ``ctx.data``.
        compute_s: ``compute_s(index, step)`` -> simulated seconds a step computes.
        latency_s: one-way latency range (virtual seconds).
        loss: message loss probability.
        wire: round-trip every message through the codec, value frames copied.
        seed: the network's seed (default: the job's).
        events: ``(at_s, action)`` pairs; ``action(run)`` runs at that virtual time
            (e.g. ``lambda run: run.kill(2)``, ``lambda run: run.add_peer()``).
        max_s: give up (``ActorpyTimeout``) after this much virtual time.
        trace_s: how often the steps' spread is sampled.
        link: ``link(net, address, peer)`` -> what the network drives for each peer, the
            seeding of ``init`` included (e.g. a wrapper that paces its sends); None: the
            peer itself.
    """

    def __init__(self, job: Any, peers: int, init: dict[str, Any], *,
                 data: Callable[[int], Any] | None = None,
                 compute_s: Callable[[int, int], float] | None = None,
                 latency_s: tuple[float, float] = (0.0005, 0.002), loss: float = 0.0,
                 wire: bool = False, seed: int | None = None,
                 events: Sequence[tuple[float, Callable[[SimRun], None]]] = (),
                 max_s: float = 3600.0, trace_s: float = 0.01,
                 link: Callable[[SimNetwork, str, Peer], Any] | None = None) -> None:
        check_run(peers, init)
        self.spec = job.spec(init)
        self.init = dict(init)
        self.data = data
        self.compute_s = compute_s
        self.events = list(events)
        self.max_s = max_s
        self.trace_s = trace_s
        self.link = link
        seed = job.seed if seed is None else seed
        self.net = SimNetwork(job.config, seed=seed, latency_s=latency_s, loss=loss, wire=wire)
        self.rng = random.Random(seed + 1)
        self.peers: dict[str, Peer] = {}
        self.order: list[str] = []
        self.truth: list[tuple[CheckRecord, dict[str, int]]] = []
        self.spreads: list[tuple[float, int, int]] = []
        self._running = False
        self.started_s = 0.0                 # virtual time at which run() started the peers
        for _ in range(peers):
            self._new_peer()
        for name, value in self.init.items():
            self.net.set(self.order[0], key_id(name), value, clock=0)

    # ------------------------------------------------------------------ membership
    def _new_peer(self, node_id: int | None = None) -> str:
        live = sorted(self.net.alive, key=lambda a: int(a[1:]))
        address = self.net.add_node(None if node_id is None else KadId(node_id))
        self.net.join(address, self.rng.choice(live) if live else None)
        index = len(self.order)
        node = self.net.nodes[address]
        runner = PeerRunner(self.spec, node, index,
                            self.data(index) if self.data is not None else None, self.compute_s)
        runner.barrier.observer = lambda record, a=address: self._observe(a, record)
        self.peers[address] = Peer(node, runner)
        peer = self.peers[address]
        self.net.attach(address, peer if self.link is None else self.link(self.net, address, peer))
        self.order.append(address)
        return address

    def add_peer(self, node_id: int | None = None) -> str:
        """A new peer joins the overlay and the running job (catching up to its step);
        ``node_id`` places it (e.g. next to a key, to make it that key's owner)."""
        address = self._new_peer(node_id)
        self._start(address, catch_up=True)
        return address

    def kill(self, index: int) -> str:
        """Fail-stop peer ``index`` (SIGKILL: no goodbye)."""
        address = self.order[index]
        self.net.kill(address)
        return address

    def leave(self, index: int) -> str:
        """Peer ``index`` stops working and leaves gracefully (hands its keys on)."""
        address = self.order[index]
        op_id, eff = self.peers[address].leave(self.net.clock.now())
        self.net.apply(address, eff)

        def stop_when_handed_on() -> None:    # the process exits once its keys are handed on
            if self.net.results.pop((address, op_id), None) is not None:
                self.net.kill(address)
            else:
                self.net.clock.call_later(self.trace_s, stop_when_handed_on)
        stop_when_handed_on()
        return address

    def _start(self, address: str, catch_up: bool) -> None:
        peer = self.peers[address]
        assert peer.runner is not None
        now = self.net.clock.now()
        self.net.apply(address, peer.route(peer.runner.start(now, catch_up), now))

    # ------------------------------------------------------------------ running
    def runners(self) -> dict[str, PeerRunner]:
        """Live peers' runners."""
        return {a: p.runner for a, p in self.peers.items()
                if a in self.net.alive and p.runner is not None}

    def _observe(self, address: str, record: CheckRecord) -> None:
        # the step each peer reports: its runner's, or FINISHED once its stop said so
        truth = {a: self.peers[a].node.step for a in record.seen if a in self.peers}
        self.truth.append((record, truth))

    def _trace(self) -> None:
        working = [r.step for r in self.runners().values()
                   if r.phase in (Phase.WORKING, Phase.BARRIER)]
        if working:
            self.spreads.append((self.net.clock.now(), min(working), max(working)))
        if self._running:
            self.net.clock.call_later(self.trace_s, self._trace)

    def _finished(self) -> bool:
        runners = self.runners()
        for address, runner in runners.items():
            if runner.phase == Phase.FAILED:
                kind, message, trace = runner.error or ("Error", "failed", "")
                raise RemoteError(kind, message, trace, address)
        return all(r.phase == Phase.DONE for r in runners.values())

    def run(self) -> SimResult:
        """Start every peer, run until all live ones stopped, read the model back.

        Raises:
            RemoteError: a peer's callback raised (its type, message and traceback).
            ActorpyTimeout: not finished within ``max_s`` virtual seconds.
        """
        clock = self.net.clock
        start = self.started_s = clock.now()
        delivered = self.net.delivered
        for at_s, action in self.events:
            clock.call_later(at_s, lambda act=action: act(self))
        self._running = True
        for address in list(self.order):
            self._start(address, catch_up=False)
        self._trace()
        while not self._finished():
            due = clock.next_due()
            if due is None or due - start > self.max_s:
                self._running = False
                raise ActorpyTimeout(f"job {self.spec.name!r} did not finish within "
                                     f"{self.max_s} virtual seconds; steps: {self.steps()}")
            clock.run_until(due)
        seconds = clock.now() - start
        self._running = False
        self.net.run_for(1.0)                       # the last replications land
        model, clocks = {}, {}
        for name in self.init:
            model[name], clocks[name] = self.get(name)
        runners = {a: p.runner for a, p in self.peers.items() if p.runner is not None}
        return SimResult(
            model=model, clocks=clocks, steps=self.steps(), seconds=seconds,
            updates=sum(sum(r.owner.applied.values()) for r in runners.values()),
            owners={n: {a for a, r in runners.items() if r.owner.applied.get(n)}
                    for n in self.init},
            records={a: r.barrier.records for a, r in runners.items()},
            truth=self.truth, spreads=self.spreads,
            messages=self.net.delivered - delivered)

    def steps(self) -> dict[str, int]:
        """Every peer's completed steps (killed ones: when they died)."""
        return {a: p.runner.step for a, p in self.peers.items() if p.runner is not None}

    # ------------------------------------------------------------------ the overlay
    def get(self, name: str, via: str | None = None) -> tuple[Any, int]:
        """``(value, clock)`` of key ``name``: the newest copy among its closest peers."""
        address = via or sorted(self.net.alive)[0]
        done = self.net.get(address, key_id(name), newest=True)
        if done.blob is None:
            raise KeyError(f"key {name!r} is on no live peer")
        return done.value, done.clock

    def set(self, name: str, value: Any, via: str | None = None) -> int:
        """Store ``value`` under ``name`` from a live peer; returns its clock."""
        address = via or sorted(self.net.alive)[0]
        return self.net.set(address, key_id(name), value).clock


class BusyInbox:
    """A ``SimRun`` link (``link=lambda net, a, p: BusyInbox(net, a, p, 0.0003)``): the
    peer handles its messages in arrival order, ``service_s`` each (its timers at once), as
    one thread on a busy host does; a burst of requests waits in its inbox
    (``bench/peer_keys.py``)."""

    def __init__(self, net: SimNetwork, address: str, inner: Peer, service_s: float) -> None:
        self.net, self.address, self.inner, self.service_s = net, address, inner, service_s
        self.free_at = 0.0

    def receive(self, sender: str, message: Any, now: float, frames: Any = ()) -> Effects:
        self.free_at = max(self.free_at, now) + self.service_s

        def handle() -> None:
            if self.address not in self.net.alive:
                return
            try:
                eff = self.inner.receive(sender, message, self.net.clock.now(), frames)
            except ProtocolError:       # an answer after its request's end: dropped
                self.net.rejected += 1
                return
            self.net.apply(self.address, eff)
        self.net.clock.call_later(self.free_at - now, handle)
        return Effects()

    def on_timer(self, kind: Any, token: int, now: float) -> Effects:
        return self.inner.on_timer(kind, token, now)

"""The one place where a peer meets the runtime: ``PeerService``, a core service that
drives one ``Peer`` (its Kademlia node and, in a job, its runner).

- Its overlay address is ``"<node id>/<service id>"``. A received overlay message is handed
  to the node under the address built from the envelope's *authenticated* sender node and
  sender service, never from anything in the payload.
- Overlay messages travel as ``PeerKind.OVERLAY`` casts whose payload is
  ``(rpc.encode(message), [value buffers])``: the tuple holds only plain values and the
  buffers are uint8 arrays, which the core's serde sends out of band (no copy, no pickle).
- Each ``SetTimer`` runs on the service thread: one due at once is posted to the service's
  inbox (after the messages already there); the others wait in one heap with a single
  ``ctx.schedule`` armed for the earliest (``timers.py``: a peer sets an RPC timeout per
  request). Stale timers are no-ops in the node, so none is ever cancelled.
- A message the node refuses (``ProtocolError``: malformed, oversize, impostor) is dropped
  with a WARNING naming the sender (once per 10 s), and so is the sender from the routing
  table if it is there. An unsolicited answer (mostly one after its RPC timeout) is only
  counted (the node takes one after an adaptive timeout but within ``rpc_timeout_s``, or
  within a value's allowance: ``kademlia/sizes.py``).
- The driver's control kinds (``INFO``, ``JOIN``, ``SET``, ``GET``, ``START``, ``STATUS``,
  ``LEAVE``) are requests answered when the node's operation is ``Done`` (deferred replies).
- A standalone peer's job is leased to its driver (``DRIVER_LEASE_S``). The renewal is the
  peer's link to the driver staying up: libzmq's heartbeats on it, which no Python thread
  of either side has to run, so a driver busy for seconds keeps its job and the training
  loop sends nothing more. A driver gone for the lease (SIGKILL, Ctrl-C between JOB and
  START) loses its job: the peer drops the runner, logs one WARNING and takes the next JOB.
"""
from __future__ import annotations

import functools
import logging
import random
import threading
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from actorpy.errors import ActorpyError, ProtocolError
from actorpy.ids import NodeId
from actorpy.log import Throttle
from actorpy.runtime.context import ServiceRef
from actorpy.runtime.service import Envelope, Reply, Service, ServiceContext, handles

from .context import JobSpec, own_copy, run_data
from .kademlia import rpc
from .kademlia.events import Done, Effects, KademliaConfig
from .kademlia.ids import key_id, random_id
from .kademlia.messages import REPLY_KINDS
from .kademlia.node import KademliaNode
from .kademlia.routing import Contact
from .peer import Peer
from .runner import PeerRunner, Phase, Timer
from .timers import TimerHeap

if TYPE_CHECKING:
    from .dialer import Dialer

log = logging.getLogger(__name__)
_DROPS = Throttle()   # a member sending garbage is said once per 10 s, not per message


class PeerKind(IntEnum):
    """Messages to a peer service."""

    OVERLAY = 1   # peer -> peer (cast): (rpc.encode(msg), [value buffers])
    INFO = 2      # driver -> peer: (kademlia id, overlay address)
    JOIN = 3      # driver -> peer: join through (id, address); reply: contacts found
    SET = 4       # driver -> peer: (name, value); reply: the clock written
    GET = 5       # driver -> peer: name; reply: (value, clock) or None (newest copy)
    START = 6     # driver -> peer: catch_up; start the job's runner
    STATUS = 7    # driver -> peer: dict of phase, step, updates applied, error
    LEAVE = 8     # driver -> peer: hand stored keys on, tell every contact; reply: done
    SEED = 9      # driver -> peer: init dict, stored at clock 0
    FIND = 10     # driver -> peer: id to look up; reply: (contacts found, rounds, seconds)
    LOOKUP = 11   # driver -> peer: key name (FIND_VALUE, first copy); reply: (found, rounds, s)
    # standalone peers (no manager; ``dialer.py``, ``standalone.py``, ``overlay_run.py``)
    HELLO = 20    # anyone -> peer (cast): (token, my endpoint); answered by a WELCOME cast
    WELCOME = 21  # peer -> the HELLO's sender (cast): (token, kademlia id, overlay address)
    MEMBERS = 22  # driver -> peer: [(kademlia id, overlay address, endpoint)]: itself, its table
    JOB = 23      # driver -> peer: (JobSpec, config, index, data): run this job next
    END = 24      # driver -> peer: the job is over; drop its runner, serve the overlay on


def address_of(ref: ServiceRef) -> str:
    """A service's overlay address: ``"<node id>/<service id>"``."""
    return f"{ref.node}/{ref.service}"


def ref_of(address: str) -> ServiceRef:
    """The service behind an overlay address (the inverse of ``address_of``)."""
    node, _, service = address.rpartition("/")
    return ServiceRef(NodeId(node), int(service))


#: The overlay's answers (PONG, STORED, NODES, VALUE, REPLY): they complete this peer's own
#: operations, whose continuations may run user code
ANSWER_KINDS = frozenset().union(*REPLY_KINDS.values())


#: A standalone peer's job is leased to its driver (the sender of its JOB), from JOB to END,
#: while the peer's link to the driver is up; once that link is down this long the peer ends
#: the job on its own. Twice the driver's own patience with a peer (``overlay_run.GONE_S``).
DRIVER_LEASE_S = 3.0
#: how many times per lease a peer looks at its driver's link (the bound is lease * 7/6)
LEASE_CHECKS = 6


#: a peer's I/O thread serves others beside its ``push`` once it has run this long; the
#: longer with a model over QUICK_MODEL_BYTES (``ServiceContext.unlocked``, docs/peer.md)
UNLOCK_AFTER_S, BIG_UNLOCK_AFTER_S = 0.0005, 0.02

#: overlay addresses whose parsed service a peer keeps (contacts', mostly; cleared when full)
MAX_REFS = 4096


def _is_answer(wire: Any) -> bool:
    """Whether an overlay message (not validated yet) is an answer."""
    return type(wire) is tuple and len(wire) > 1 and wire[1] in ANSWER_KINDS


def wire_payload(message: Any) -> tuple[tuple, list[np.ndarray]]:
    """What an overlay cast carries: the plain tuple and the value buffers (zero-copy)."""
    return rpc.encode(message), [np.frombuffer(f, dtype=np.uint8)
                                 for f in rpc.value_frames(message)]


class PeerService(Service):
    """One peer on a worker (see the module docstring).

    Args:
        ctx: the service context.
        config: the overlay's settings.
        seed: seeds this peer's Kademlia id and its node's rng (with ``index``).
        index: the peer's index in its job (its runner's rng and data).
        spec: the job to run, or None for a bare overlay peer.
        data: ``data(index)`` -> what the runner finds in ``ctx.data``.
        dialer: a standalone peer's endpoint book (no manager): overlay casts then carry
            endpoint hints, and go only to nodes whose endpoint is known.
        lease_s: a standalone peer ends its job once its link to the job's driver has been
            down this long (see ``DRIVER_LEASE_S``).
    """

    def __init__(self, ctx: ServiceContext, config: KademliaConfig, seed: int = 0,
                 index: int = 0, spec: JobSpec | None = None,
                 data: Callable[[int], Any] | None = None, *,
                 dialer: Dialer | None = None, lease_s: float = DRIVER_LEASE_S) -> None:
        super().__init__(ctx)
        self.clock = ctx.clock
        self.address = address_of(ctx.ref)
        rng = random.Random(f"{seed}/{index}/{self.address}")
        node = KademliaNode(random_id(rng), self.address, config,
                            rng=random.Random(rng.getrandbits(64)), now=self.clock.now())
        runner = None
        if spec is not None:
            runner = PeerRunner(spec, node, index, run_data(data, index))
        self.peer = Peer(node, runner)
        self.rejected = 0       # malformed or unauthenticated overlay messages dropped
        self.late = 0           # unsolicited answers (mostly after their rpc timeout)
        self.dialer = dialer
        self.unreachable = 0    # overlay sends dropped: no endpoint known (standalone)
        self.lease_s = lease_s
        self._driver = NodeId("")               # who sent the JOB of the current runner
        self._waiting: dict[int, tuple[Reply, Callable[[Done], Any]]] = {}
        self._timers = TimerHeap(ctx, self.clock.now, self._due)
        self._refs: dict[str, ServiceRef] = {}  # overlay address -> service, parsed once
        self._thread = threading.get_ident()    # the service's own (it constructs us)
        self._set_quick(spec)
        self.perform(node.start(self.clock.now()))

    def _set_quick(self, spec: JobSpec | None) -> None:
        """Overlay messages may be handled on the node's I/O thread while the peer is idle
        (a bare overlay peer, or a job's small model) and while its ``push`` runs, from
        ``UNLOCK_AFTER_S`` on (``BIG_UNLOCK_AFTER_S``, a larger model): a long step does
        not make its peer look dead to the peers pushing to it."""
        quick = spec is None or spec.quick
        kinds = frozenset({PeerKind.OVERLAY, PeerKind.STATUS})
        self.quick_kinds, self.aside_kinds = (kinds, frozenset()) if quick \
            else (frozenset(), kinds)
        if self.peer.runner is not None:
            self.peer.runner.unlocked = functools.partial(
                self.ctx.unlocked, after_s=UNLOCK_AFTER_S if quick else BIG_UNLOCK_AFTER_S)

    # ------------------------------------------------------------------ effects
    def perform(self, eff: Effects) -> None:
        """Send, arm timers, and answer the driver's operations that finished."""
        for send in eff.sends:
            ref = self._refs.get(send.address)
            if ref is None:
                try:
                    ref = ref_of(send.address)
                except ValueError:
                    log.warning("%s: no such peer address %r; message dropped", self.address,
                                send.address)
                    continue
                if len(self._refs) >= MAX_REFS:
                    self._refs.clear()
                self._refs[send.address] = ref
            payload: tuple = wire_payload(send.message)
            if self.dialer is not None:
                if not self.dialer.knows(ref.node):
                    self.unreachable += 1   # the overlay's rpc timeout accounts for it
                    continue
                named = [c.address.rpartition("/")[0]
                         for c in getattr(send.message, "contacts", ())]
                payload = (*payload, self.dialer.hints(named))
            self.ctx.cast(ref, PeerKind.OVERLAY, payload)
        for timer in eff.timers:
            if timer.delay_s <= 0:
                self.ctx.post_timer(self._fire, timer.kind, timer.token, self.peer.runner)
            else:
                self._timers.add(self.clock.now() + timer.delay_s,
                                 (timer.kind, timer.token, self.peer.runner))
        for done in eff.done:
            waiting = self._waiting.pop(done.op_id, None)
            if waiting is not None:
                reply, answer = waiting
                try:
                    reply.send(answer(done))
                except Exception as exc:  # noqa: BLE001 - the driver gets the error
                    reply.fail(exc)

    def _drop_runner(self) -> None:
        """The job is over here: drop its runner and its data now. A runner sits in
        reference cycles (bound methods between it, its owner and the node), which Python
        frees only at a cyclic collection, and large arrays do little to bring one on: a
        worker kept every finished job's data (200 MB a peer of bench/peer.py's Job A) until
        the kernel killed it for memory."""
        runner, self.peer.runner = self.peer.runner, None
        if runner is not None:
            runner.data = None
            runner.values.clear()
        self._set_quick(None)

    def close(self) -> None:
        """The service stopped: its job's data and the model's values go now (see
        ``_drop_runner``), with the timers that hold its runner."""
        self._timers.clear()
        self._drop_runner()
        for key in self.peer.node.storage.keys():
            self.peer.node.storage.drop(key)

    def _due(self, timers: list[tuple[Any, int, PeerRunner | None]]) -> None:
        for kind, token, runner in timers:
            self._fire(kind, token, runner)

    def _fire(self, kind: Any, token: int, runner: PeerRunner | None) -> None:
        if isinstance(kind, Timer) and runner is not self.peer.runner:
            return   # a timer of a job this standalone peer has ended
        self.perform(self.peer.on_timer(kind, token, self.clock.now()))

    def _op(self, env: Envelope, start: Callable[[], tuple[int, Effects]],
            answer: Callable[[Done], Any]) -> None:
        reply = env.defer()     # first: a cast raises, nothing begun (a LEAVE began leaving)
        op_id, eff = start()
        self._waiting[op_id] = (reply, answer)
        self.perform(self.peer.route(eff, self.clock.now()))

    # ------------------------------------------------------------------ overlay
    @handles(PeerKind.OVERLAY)
    def overlay(self, payload: Any, env: Envelope) -> None:
        sender = address_of(env.sender_ref)   # authenticated: the header, not the payload
        try:
            if type(payload) is not tuple or len(payload) not in (2, 3) \
                    or type(payload[1]) is not list:
                raise ProtocolError("an overlay message is (wire tuple, [value buffers]"
                                    "[, endpoint hints])")
            runner = self.peer.runner
            on_io_thread = runner is not None and threading.get_ident() != self._thread
            if on_io_thread and _is_answer(payload[0]) and not runner.awaits_answers \
                    and not runner.computing:
                # On the I/O thread, the peer idle: an answer completes one of our
                # operations, whose next step begins on the service's thread at once, so it
                # goes there; here only if a computed step waits for it (its pushes leave
                # a wake-up sooner; ``Timer.SENT`` counts the step) or our push runs
                # (``computing``: posted, it would hold up the messages after it). Requests
                # are handled here; a step they let begin waits for a timer.
                self.ctx.post(self.overlay, payload, env)
                return
            if len(payload) == 3 and self.dialer is not None:
                self.dialer.learn_hints(env.sender, payload[2])   # before any answer
            if on_io_thread:
                assert runner is not None
                runner.on_io_thread = True
            try:
                eff = self.peer.receive(sender, payload[0], self.clock.now(), payload[1],
                                        perform=self.perform)
            finally:
                if on_io_thread:
                    runner.on_io_thread = False
        except ProtocolError as exc:
            if str(exc).startswith("unsolicited"):
                # most often an answer that came after its rpc timeout: not an attack
                self.late += 1
                log.debug("peer %s dropped a message from %s: %s", self.address, sender, exc)
                return
            self.rejected += 1
            now = self.clock.now()
            was_contact, eff = self.peer.node.drop_contact(sender, now)
            _DROPS.log(log, (self.address, sender), "peer %s dropped a message from %s%s: %s",
                       self.address, sender, " and dropped it from the routing table" * was_contact,
                       exc)
            self.perform(self.peer.route(eff, now))
            return
        self.perform(eff)

    # ------------------------------------------------------------------ driver
    @handles(PeerKind.INFO)
    def info(self, _: Any, env: Envelope) -> tuple[int, str]:
        return int(self.peer.node.node_id), self.address

    @handles(PeerKind.JOIN)
    def join(self, contact: tuple[int, str], env: Envelope) -> None:
        # checked first: a float id kept in the table failed every later job of the peer
        self._op(env, functools.partial(self.peer.node.join, [rpc.check_contact(contact)],
                                        self.clock.now()), lambda done: len(done.contacts))

    @handles(PeerKind.SET)
    def set(self, item: tuple[str, Any], env: Envelope) -> None:
        name, value = rpc.check_pair(item, "SET takes (key name, value)")
        self._op(env, functools.partial(self.peer.node.set, key_id(rpc.check_name(name)), value,
                                        self.clock.now()), lambda done: done.clock)

    @handles(PeerKind.SEED)
    def seed(self, init: dict[str, Any], env: Envelope) -> int:
        now = self.clock.now()
        for name, value in init.items():
            op_id, eff = self.peer.node.set(key_id(name), value, now, clock=0)
            self.perform(self.peer.route(eff, now))
        return len(init)

    @handles(PeerKind.GET)
    def get(self, name: str, env: Envelope) -> None:
        def answer(done: Done) -> tuple[Any, int] | None:   # a copy; a tensor stays one
            return None if done.blob is None else (own_copy(done.value), done.clock)
        key = key_id(rpc.check_name(name))
        self._op(env, functools.partial(self.peer.node.get, key, self.clock.now(), newest=True),
                 answer)

    @handles(PeerKind.FIND)
    def find(self, target: int, env: Envelope) -> None:
        self._op(env, functools.partial(self.peer.node.find_node, rpc.check_id(target),
                                        self.clock.now()),
                 lambda done: (len(done.contacts), done.rounds, done.elapsed_s))

    @handles(PeerKind.LOOKUP)
    def lookup(self, name: str, env: Envelope) -> None:
        self._op(env, functools.partial(self.peer.node.get, key_id(rpc.check_name(name)),
                                        self.clock.now()),
                 lambda done: (done.blob is not None, done.rounds, done.elapsed_s))

    @handles(PeerKind.START)
    def start(self, catch_up: bool, env: Envelope) -> None:
        runner = self._runner()
        now = self.clock.now()
        self.perform(self.peer.route(runner.start(now, bool(catch_up)), now))

    @handles(PeerKind.STATUS)
    def status(self, _: Any, env: Envelope) -> dict[str, Any]:
        runner = self.peer.runner
        node = self.peer.node
        return {"address": self.address, "rejected": self.rejected, "late": self.late,
                "unreachable": self.unreachable, "rpcs": node.stats.rpcs_sent,
                "timeouts": node.stats.timeouts, "late_replies": node.stats.late_replies,
                "table": sorted(c.address for c in node.routing.contacts()),
                "keys": sorted(int(k) for k in node.storage.keys()),
                "phase": int(runner.phase) if runner else int(Phase.IDLE),
                "step": runner.step if runner else 0,
                "applied": dict(runner.owner.applied) if runner else {},
                "error": runner.error if runner else None}

    @handles(PeerKind.LEAVE)
    def leave(self, _: Any, env: Envelope) -> None:
        self._op(env, functools.partial(self.peer.leave, self.clock.now()),
                 lambda done: len(done.stored_on))

    # ------------------------------------------------------------------ standalone
    @handles(PeerKind.HELLO)
    def hello(self, payload: Any, env: Envelope) -> None:
        """Who are you? Learn the asker's endpoint, answer with a WELCOME cast."""
        dialer = self._dialer()
        try:
            if type(payload) is not tuple or len(payload) != 2 or type(payload[0]) is not int:
                raise ProtocolError("not (token, endpoint)")
            dialer.learn_hints(env.sender, [[env.sender, payload[1]]])   # validated
        except ProtocolError as exc:
            self.rejected += 1
            _DROPS.log(log, (self.address, env.sender), "peer %s dropped a HELLO from %s: %s",
                       self.address, env.sender, exc)
            return
        self.ctx.cast(env.sender_ref, PeerKind.WELCOME,
                      (payload[0], int(self.peer.node.node_id), self.address))

    @handles(PeerKind.MEMBERS)
    def members(self, _: Any, env: Envelope) -> list[tuple[int, str, str]]:
        dialer = self._dialer()
        out = [(int(self.peer.node.node_id), self.address, dialer.endpoint)]
        for contact in self.peer.node.routing.contacts():
            endpoint = dialer.endpoint_of(contact.address.rpartition("/")[0])
            if endpoint is not None:
                out.append((int(contact.node_id), contact.address, endpoint))
        return out

    @handles(PeerKind.JOB)
    def job(self, payload: tuple[JobSpec, KademliaConfig, int, Any], env: Envelope) -> int:
        """Run this job next, leased to its sender: the overlay's store starts empty for it
        (its keys get clock 0 again), the node takes the job's overlay settings (same
        ``ksize``)."""
        spec, config, index, data = payload
        dialer = self._dialer()
        node = self.peer.node
        runner = self.peer.runner
        if dialer.node.link_down_for(env.sender) is None:
            raise ActorpyError(f"peer {self.address} does not know where driver {env.sender} "
                               "listens, so it could not tell when it is gone: a driver says "
                               "hello first (OverlayClient.members)")
        # Another run's job keeps the peer until its END while its driver holds the lease,
        # started or not; over here too while that driver is connected (DONE: owns keys).
        if runner is not None and runner.spec.run != spec.run and not (
                runner.phase in (Phase.DONE, Phase.FAILED)
                and (env.sender == self._driver or dialer.node.link_down_for(self._driver))):
            gone = self._driver_gone(asker=env.sender)
            if gone is None:
                down = dialer.node.link_down_for(self._driver) or 0.0
                state = f"its connection down for {down:.1f} s, the job ends " \
                        f"{self.lease_s - down:.1f} s from now" if down else "connected"
                raise ActorpyError(
                    f"peer {self.address} is running job {runner.spec.name!r} for another "
                    f"driver ({self._driver}: {state}); submit this one once that one has "
                    f"ended (a driver gone for {self.lease_s:g} s loses its job)")
            self._end_leased(runner, gone)
        if config.ksize != node.config.ksize:
            raise ActorpyError(f"this overlay runs with ksize={node.config.ksize}, the job "
                               f"asks for {config.ksize}")
        node.config = config
        for key in node.storage.keys():
            node.storage.drop(key)
        runner = self.peer.runner = PeerRunner(spec, node, index, run_data(data, index))
        self._driver = env.sender
        self._set_quick(spec)
        self.ctx.schedule(self.lease_s / LEASE_CHECKS, self._check_lease, runner)
        return len(node.routing.contacts())

    @handles(PeerKind.END)
    def end(self, run: int, env: Envelope) -> bool:
        """The job of run ``run`` is over: keep serving the overlay, without its runner (a
        runner of another run stays: its driver ends it)."""
        if self.peer.runner is None or self.peer.runner.spec.run != run:
            return False
        self._drop_runner()
        return True

    def _driver_gone(self, asker: NodeId | None = None) -> str | None:
        """Why the current job's driver has lost its lease, or None while it holds it.

        ``asker``: a driver asking for the peer. One now listening at the holder's endpoint
        took over its port, so the holder is dead (the link, redialled, is up to the new one).
        """
        dialer = self._dialer()
        down = dialer.node.link_down_for(self._driver)
        if down is None:   # forgotten: another claimed its endpoint, or down for long
            why = dialer.replacement(self._driver)
            return f"driver {why}" if why else "its connection is not watched any more"
        if down > self.lease_s:
            return f"its connection has been down for {down:.1f} s"
        endpoint = dialer.endpoint_of(self._driver)
        if asker is not None and asker != self._driver and endpoint is not None \
                and dialer.endpoint_of(asker) == endpoint:
            return f"driver {asker} now listens at its endpoint {endpoint}"
        return None

    def _check_lease(self, runner: PeerRunner) -> None:
        """A timer, every ``lease_s / LEASE_CHECKS`` while ``runner`` is the peer's job."""
        if runner is not self.peer.runner:
            return   # ended (END, or another job took the peer)
        gone = self._driver_gone()
        if gone is None:
            self.ctx.schedule(self.lease_s / LEASE_CHECKS, self._check_lease, runner)
        else:
            self._end_leased(runner, gone)

    def _end_leased(self, runner: PeerRunner, why: str) -> None:
        """End the job of a driver that lost its lease (``why``): the peer is free again."""
        if runner.phase in (Phase.DONE, Phase.FAILED):
            log.info("peer %s dropped the ended job %r of driver %s: %s", self.address,
                     runner.spec.name, self._driver, why)
        else:
            log.warning("peer %s ended job %r (run %x) on its own: its driver %s is gone "
                        "(%s; lease %g s)", self.address, runner.spec.name, runner.spec.run,
                        self._driver, why, self.lease_s)
        self._drop_runner()

    def _dialer(self) -> Dialer:
        if self.dialer is None:
            raise ActorpyError(f"peer {self.address} is not a standalone peer")
        return self.dialer

    def _runner(self) -> PeerRunner:
        if self.peer.runner is None:
            raise ActorpyError(f"peer {self.address} runs no job: start it with a JobSpec")
        return self.peer.runner

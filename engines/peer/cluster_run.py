"""A P2P job on a cluster's workers: ``Job.run(cluster, peers=N, init=...)``.

The driver only places and starts the peers and reads the result: it starts N
``PeerService``s round-robin over the workers (several per worker when N exceeds them),
joins each through the first one, stores the initial model on the overlay, starts every
runner, waits until every live peer's stop said so, and reads the model back from the
overlay (newest copy among each key's holders). Training itself never touches the driver.

At the end every peer leaves gracefully, one after the other (``LEAVE``: it hands the keys it
holds to the next closest peers and tells its contacts, who drop it at once), then its
service stops; ``leave_peer`` does the same for one peer while the job runs.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from actorpy.errors import (ActorpyError, ActorpyTimeout, ConfigError, NodeLost, RemoteError,
                            ServiceError)
from actorpy.runtime.membership import MANAGER_ID
from actorpy.values import QUICK_MODEL_BYTES, nbytes

from .context import JobSpec, check_run
from .kademlia.events import KademliaConfig
from .runner import Phase
from .shell import PeerKind, PeerService

log = logging.getLogger(__name__)

CALL_S = 30.0
STOP_S = 10.0      # the peers' stops at the end of a job, all together
FAILED_STOP_S = 2.0    # the same when the job failed: a peer may hang in a callback
STOP_MIN_S = 0.1   # the stop of a peer after the others took all the time: sent, hardly awaited


class _TimeUp(ActorpyTimeout):
    """The job's deadline passed while the driver waited on a peer."""


@dataclass
class RunResult:
    """What a job on a cluster ends with.

    Attributes:
        model: key -> final value, read from the overlay. clocks: key -> its version clock.
        steps: peer address -> steps it completed (lost peers: their last report).
        seconds: wall time from starting the runners until every live peer stopped.
        updates: pushes folded in by the owners, over all keys (a lost owner: up to its
            last report).
        lost: addresses of peers whose worker went away during the run.
        left: addresses of peers that left the running job (``leave_peer``).
        rejected: overlay messages the peers dropped as malformed or unauthenticated.
        applied: peer address -> pushes it folded in as a key's owner (which peers owned
            the keys, as far as their last report).
    """

    model: dict[str, Any]
    clocks: dict[str, int]
    steps: dict[str, int]
    seconds: float
    updates: int
    lost: list[str]
    rejected: int
    left: list[str]
    applied: dict[str, int] = field(default_factory=dict)


def start_peers(cluster: Any, n: int, config: KademliaConfig, seed: int = 0,
                spec: JobSpec | None = None, data: Callable[[int], Any] | None = None, *,
                name: str = "overlay", deadline: float = math.inf,
                refs: list[Any] | None = None) -> tuple[list[Any], list[tuple[int, str]]]:
    """Start ``n`` ``PeerService``s round-robin over the cluster's workers and join them
    into one overlay; returns their refs and ``(kademlia id, address)``s. Each service
    started is appended to ``refs`` at once (when given), so a caller can stop them all
    should this fail part way.

    Raises:
        ActorpyError: the cluster has no workers.
        ActorpyTimeout: ``deadline`` (``time.monotonic()``) passed before all were started
            and joined (``Job.run(peers=10000, timeout_s=10)`` went on for many minutes).
    """
    workers = cluster.workers()
    if not workers:
        raise ActorpyError("the cluster has no workers: add some (cluster.add_workers)")
    refs = [] if refs is None else refs

    def call_s(done: int, why: str = "") -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ActorpyTimeout(f"the job's timeout ran out with {done} of {n} peers started "
                                 f"and joined{why}: give it a longer timeout_s or fewer peers")
        return min(CALL_S, left)

    for i in range(n):     # (start_service's own default waited 60 s past the deadline)
        try:
            refs.append(cluster.start_service(PeerService, config, seed, i, spec, data,
                                              node=workers[i % len(workers)],
                                              name=f"peer/{name}/{i}", timeout_s=call_s(i)))
        except ActorpyTimeout as exc:
            call_s(i, f" ({exc})")      # the job's deadline: said so, with which worker
            raise
    infos = [cluster.call(r, PeerKind.INFO, timeout_s=call_s(n)) for r in refs]
    for ref in refs[1:]:
        cluster.call(ref, PeerKind.JOIN, infos[0], timeout_s=call_s(n))
    if n > 2:   # the first peers learn of the later ones too
        cluster.call(refs[0], PeerKind.JOIN, infos[-1], timeout_s=call_s(n))
    return refs, infos


def check_timeout(timeout_s: Any) -> None:
    """Refuse a run's ``timeout_s`` that is no finite number > 0 (NaN never times out).

    Raises:
        ConfigError: naming the value.
    """
    if not isinstance(timeout_s, numbers.Real) or not 0 < timeout_s < math.inf:
        raise ConfigError(f"timeout_s must be a finite number > 0, got {timeout_s}")


class ClusterRun:
    """A ``peer.Job`` on a running cluster (see the module docstring).

    Args:
        job: the ``peer.Job``.
        cluster: a driver ``Cluster`` (embedded or joined).
        peers: how many peers.
        init: key -> initial value.
        data: ``data(index)`` -> what peer ``index`` finds in ``ctx.data`` (shipped to it).
        timeout_s: give up (``ActorpyTimeout``) after this long.
        poll_s: how often the driver asks the peers how far they are.
        on_poll: ``on_poll(run, seconds)`` after each poll while training (a monitor: it
            may read keys with ``run.read``); its cost delays only the driver.
    """

    def __init__(self, job: Any, cluster: Any, peers: int, init: dict[str, Any], *,
                 data: Callable[[int], Any] | None = None, timeout_s: float = 300.0,
                 poll_s: float = 0.05,
                 on_poll: Callable[[ClusterRun, float], None] | None = None) -> None:
        check_run(peers, init)
        check_timeout(timeout_s)
        self.job = job
        self.spec = dataclasses.replace(job.spec(init),
                                        quick=nbytes(init) <= QUICK_MODEL_BYTES)
        self.cluster = cluster
        self.n = peers
        self.init = dict(init)
        self.data = data
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.refs: list[Any] = []
        self.addresses: list[str] = []
        self.lost: set[int] = set()
        #: how the last peer counted lost went ("" while none is)
        self.last_loss = ""
        self.left: set[int] = set()
        self.last: dict[int, dict[str, Any]] = {}
        self.on_poll = on_poll
        self.started = 0.0
        self.deadline = math.inf
        self._stop = threading.Event()

    def start_peers(self) -> None:
        """Start the services and build the overlay (each joins through peer 0)."""
        self.refs, infos = start_peers(self.cluster, self.n, self.job.config, self.job.seed,
                                       self.spec, self.data, name=f"{self.spec.name}/{id(self):x}",
                                       deadline=self.deadline, refs=self.refs)
        self.addresses = [a for _, a in infos]

    def run(self) -> RunResult:
        """Place the peers, seed the model, train, read the model back.

        Raises:
            RemoteError: a peer's callback raised (its type, message and traceback).
            ActorpyTimeout: not finished within ``timeout_s``.
        """
        deadline = self.deadline = time.monotonic() + self.timeout_s
        failed = True
        try:
            self.start_peers()
            self._setting_up(PeerKind.SEED, self.init, first=True)
            for name in self.init:      # the seed is on its holders before anyone reads it
                self._wait(lambda n=name: self.read(n) is not None, deadline, f"seed {name}")
            started = self.started = time.monotonic()
            # a peer owning its keys runs its first step in START
            self._setting_up(PeerKind.START, False)
            self._wait(self._finished, deadline, "every peer to stop")
            seconds = time.monotonic() - started
            # The round that saw every peer done asked the owners before the last pushers
            # finished; every push is folded in now, so one more round counts all of them.
            self.status()
            model, clocks = {}, {}
            for name in self.init:
                got = self.read(name)
                if got is None:
                    raise ActorpyError(f"key {name!r} is on no live peer: lost")
                model[name], clocks[name] = got
            live = [s for i, s in self.last.items() if i not in self.lost]
            result = RunResult(model=model, clocks=clocks,
                               steps={s["address"]: s["step"] for s in self.last.values()},
                               seconds=seconds, updates=self.updates(),
                               lost=[self.addresses[i] for i in sorted(self.lost)],
                               rejected=sum(s["rejected"] for s in live),
                               left=[self.addresses[i] for i in sorted(self.left)],
                               applied={s["address"]: sum(s["applied"].values())
                                        for s in self.last.values()})
            failed = False
            return result
        finally:
            self.stop(FAILED_STOP_S if failed else STOP_S)

    def add_peer(self, node: Any = None) -> str:
        """A new peer joins the overlay (through a live peer) and the running job, catching
        up to the highest step it finds; returns its address. Call it from ``on_poll``.

        Raises:
            ActorpyError: no live peer to join through.
        """
        live = self._live()
        if not live:
            raise ActorpyError("no live peer to join the job through")
        workers = self.cluster.workers()
        index = len(self.refs)
        ref = self.cluster.start_service(
            PeerService, self.job.config, self.job.seed, index, self.spec, self.data,
            node=node if node is not None else workers[index % len(workers)],
            name=f"peer/{self.spec.name}/{id(self):x}/{index}",
            timeout_s=min(CALL_S, max(self.deadline - time.monotonic(), 0.001)))
        contact = self.cluster.call(self.refs[live[0]], PeerKind.INFO, timeout_s=CALL_S)
        self.cluster.call(ref, PeerKind.JOIN, contact, timeout_s=CALL_S)
        _, address = self.cluster.call(ref, PeerKind.INFO, timeout_s=CALL_S)
        self.refs.append(ref)
        self.addresses.append(address)
        self.cluster.call(ref, PeerKind.START, True, timeout_s=CALL_S)
        return address

    def leave_peer(self, index: int) -> None:
        """Peer ``index`` leaves the running job gracefully: it stops stepping and takes no
        more writes (pushers retry), hands every key it holds to the next closest peers,
        tells its contacts (they drop it at once and look its keys' owners up again), then
        its service stops. Call it from ``on_poll``.

        Raises:
            ActorpyError: ``index`` is not a live peer of this job.
        """
        if index not in self._live():
            raise ActorpyError(f"peer {index} is not a live peer of this job")
        ref = self.refs[index]
        self.cluster.call(ref, PeerKind.LEAVE, timeout_s=CALL_S)
        self.last[index] = self.cluster.call(ref, PeerKind.STATUS, timeout_s=CALL_S)
        self.left.add(index)
        self.cluster.stop_service(ref)

    def _live(self) -> list[int]:
        return [i for i in range(len(self.refs)) if i not in self.lost and i not in self.left]

    def read(self, name: str) -> tuple[Any, int] | None:
        """``(value, clock)`` of key ``name`` read through a live peer, or None.

        Raises:
            ConfigError: ``name`` is not a str (no key is).
            RemoteError: every live peer refused the read (the last one's error)."""
        if not isinstance(name, str):   # before: every peer's refusal marked it lost, the
            # job failed and the peers went on training, stopped by nobody
            raise ConfigError(f"read({name!r}): keys are named by str, not "
                              f"{type(name).__name__}")
        refused: RemoteError | None = None
        for i in self._live():
            try:
                return self.cluster.call(self.refs[i], PeerKind.GET, name, timeout_s=CALL_S)
            except (NodeLost, ServiceError) as exc:
                log.info("reading %r through peer %d failed (%s); trying another", name, i, exc)
                self.lost.add(i)
            except RemoteError as exc:   # it answered: alive, whatever stopped its read
                log.info("peer %d could not read %r (%s); trying another", i, name, exc)
                refused = exc
        if refused is not None:
            raise refused
        raise ActorpyError(f"no live peer left to read {name!r} from")

    def status(self) -> dict[int, dict[str, Any]]:
        """Every live peer's report; a peer whose worker went away is marked lost.

        Raises:
            ActorpyTimeout: a peer did not answer before the job's deadline (a callback
                that hangs holds its peer's thread, which answers STATUS too)."""
        for i in self._live():
            try:
                self.last[i] = self._call_by_deadline(i, PeerKind.STATUS)
            except _TimeUp:
                raise
            except (NodeLost, RemoteError, TimeoutError) as exc:
                self.lose(i, exc)
        return {i: self.last[i] for i in self._live() if i in self.last}

    def _setting_up(self, kind: PeerKind, *payload: Any, first: bool = False) -> None:
        """Send ``kind`` to every live peer (``first``: to the first one that answers). A
        peer lost meanwhile is left out, as one lost while training is: before, one killed
        between the overlay's listing and START failed the whole job with ``NodeLost``."""
        for i in self._live():
            try:
                self._call_by_deadline(i, kind, *payload)
            except NodeLost as exc:
                self.lose(i, exc)
                continue
            if first:
                return
        if not self._live() or first:
            raise ActorpyError(f"P2P job {self.spec.name!r}: every peer was lost before the "
                               f"job started ({self.last_loss})")

    def lose(self, i: int, exc: BaseException) -> None:
        """Peer ``i`` is gone: the job goes on without it."""
        where = self.addresses[i] if i < len(self.addresses) else i
        log.warning("peer %s is gone (%s); the job goes on without it", where, exc)
        self.lost.add(i)
        self.last_loss = f"the last, {where}: {exc}"

    def _call_by_deadline(self, i: int, kind: PeerKind, *payload: Any) -> Any:
        """Call peer ``i``, waiting no longer than the job's deadline.

        Raises:
            ActorpyTimeout: the peer did not answer by the deadline: the job's timeout, named
                as such (a START to a peer that hung in its pull ended the job with the
                call's own "got no reply within 3.7 s"; the driver's clock read after a
                STATUS timed out could be short of the deadline: a hung peer taken as gone).
        """
        left = self.deadline - time.monotonic()
        try:
            return self.cluster.call(self.refs[i], kind, *payload,
                                     timeout_s=min(CALL_S, max(left, 0.1)))
        except TimeoutError:
            if left >= CALL_S:
                raise               # CALL_S ran out first: its worker may be gone
            raise _TimeUp(f"P2P job {self.spec.name!r}: peer {self.addresses[i]} did not "
                          f"answer within the job's timeout_s={self.timeout_s} (is a "
                          "callback still running there?)") from None

    def _finished(self) -> bool:
        live = self.status()
        if not live:
            if self.cluster.node.is_dead(MANAGER_ID):   # every node looks dead to a driver
                raise ActorpyError(                     # that left the cluster
                    "every peer of the job is gone: this driver lost its connection to the "
                    "cluster's manager; is `actorpy manager` still running?")
            # how the last went: a callback that killed its peer (KeyboardInterrupt,
            # SystemExit) was said only in the workers' logs
            raise ActorpyError("every peer of the job is gone"
                               + (f" ({self.last_loss})" if self.last_loss else ""))
        for s in live.values():
            if s["phase"] == Phase.FAILED:
                kind, message, trace = s["error"] or ("Error", "failed", "")
                raise RemoteError(kind, message, trace, s["address"])
        done = all(s["phase"] == Phase.DONE for s in live.values())
        if self.on_poll is not None and not done:
            self.on_poll(self, time.monotonic() - self.started)
        return done

    def updates(self) -> int:
        """Pushes folded in so far by every owner (a lost one: up to its last report)."""
        return sum(sum(s["applied"].values()) for s in self.last.values())

    def _wait(self, done: Callable[[], bool], deadline: float, what: str) -> None:
        while not done():
            if time.monotonic() > deadline or self._stop.wait(self.poll_s):
                raise ActorpyTimeout(f"P2P job {self.spec.name!r}: timed out waiting for "
                                     f"{what}; steps: {[s['step'] for s in self.last.values()]}")

    def stop(self, wait_s: float = STOP_S) -> None:
        """Every peer still running stops. The job is over (its model was read, or it
        failed), so no peer hands its keys on: a graceful leave of each, one after the other
        as this used to do, took ~0.24 s a peer (15 s of a 20 s run with 64 peers). Messages
        to a stopped peer get an answer saying so, not a timeout. ``wait_s`` bounds all the
        stops together (a peer hung in a callback on its node's I/O thread holds its
        own until then)."""
        until = time.monotonic() + wait_s
        # the live peers, then those taken for lost: one that timed out may still run (its
        # node's death stops the others; a stop to a dead node fails at once)
        for i in [*reversed(self._live()), *sorted(self.lost - self.left)]:
            try:
                self.cluster.stop_service(self.refs[i], timeout_s=max(until - time.monotonic(),
                                                                      STOP_MIN_S))
            except Exception as exc:  # noqa: BLE001 - best effort at the end
                log.debug("stopping peer %d: %s", i, exc)
            self.left.add(i)

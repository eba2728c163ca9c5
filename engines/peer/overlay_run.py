"""A P2P job on standalone peers (``actorpy peer``): ``Job.run_overlay("tcp://HOST:PORT", ...)``.

The driver is a light client, not a peer: a core node (CURVE, the cluster secret) that
says hello to the peer at the given address, asks it and then every peer it names for
their routing tables until no new peer turns up, and then runs the job as ``Job.run``
does on a cluster (``ClusterRun``), except that the peers are already there: each gets the
job (cloudpickled, sent only to authenticated members) with its index, and at the end is
told the job is over instead of being stopped. No manager anywhere: a peer that does not
answer within a few seconds is taken as gone, and the peers hold the job for this client's
node only while their links to it are up (``shell.DRIVER_LEASE_S``): a driver killed
mid-run loses its job within the lease, and a busy one keeps it.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from concurrent import futures
import random
import secrets
import time
from typing import Any, Callable

from actorpy.config import Config
from actorpy.errors import (ActorpyError, ActorpyTimeout, ConfigError, NodeLost, ProtocolError,
                            RemoteError)
from actorpy.ids import new_node_id
from actorpy.runtime.address import node_bind, security_for
from actorpy.runtime.context import ServiceRef
from actorpy.runtime.node import Node
from actorpy.wire import message as wm

from .cluster_run import CALL_S, STOP_MIN_S, ClusterRun, RunResult, check_timeout
from .dialer import PEER_SERVICE, Dialer, Welcome, check_endpoint
from .shell import PeerKind

log = logging.getLogger(__name__)

#: a peer's link down this long, or a call unanswered this long: the peer is gone (the
#: peers' lease on this driver, ``shell.DRIVER_LEASE_S``, is longer)
GONE_S = 1.5
#: how long the peers taken as lost are given, together, to hear their job's END
LOST_END_S = 1.0
ANSWER_S = 5.0


class OverlayClient:
    """The driver's node on an overlay of standalone peers (see the module docstring).

    Args:
        address: ``tcp://HOST:PORT`` of any live peer.
        secret, secret_file: the cluster secret (else ``ACTORPY_SECRET``).
        hello_s: how long the peer at ``address`` may take to answer.
        answer_s: how long any later call may take before its peer counts as gone.

    Raises:
        ConfigError: a bad address, or no secret.
    """

    def __init__(self, address: str, *, secret: str | bytes | None = None,
                 secret_file: str | None = None, hello_s: float = 10.0,
                 answer_s: float = ANSWER_S) -> None:
        try:
            check_endpoint(address)
        except ProtocolError:   # before: an ipc:// one got a word about its directory
            raise ConfigError("the overlay's address is a standalone peer's tcp://HOST:PORT (the "
                              f"one its `actorpy peer` prints first), got {address!r}") from None
        security = security_for(address, secret=secret, secret_file=secret_file)
        self.address, self.hello_s, self.answer_s = address, hello_s, answer_s
        node_id = new_node_id(random.Random(int.from_bytes(os.urandom(8), "big")), "d")
        self.node = Node.from_config(node_id, node_bind(address, node_id), security,
                                     Config.from_env()).start()
        self.dialer = Dialer(self.node, self.node.address)

    def __enter__(self) -> OverlayClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.node.close(linger_ms=200)

    def members(self) -> list[Welcome]:
        """Every live peer reachable from ``address``, that one first.

        Raises:
            ConfigError, AuthError, ActorpyTimeout: as ``Dialer.hello`` for ``address``.
        """
        first = self.dialer.hello(self.address, self.hello_s)
        found = {first.node_id: first}
        tried = {self.address, first.endpoint}
        frontier = [first]
        while frontier:
            named: set[str] = set()
            for peer in frontier:
                try:
                    rows = self.call(ServiceRef(peer.node_id, PEER_SERVICE), PeerKind.MEMBERS)
                except (NodeLost, RemoteError) as exc:
                    log.info("peer %s did not list its contacts: %s", peer.endpoint, exc)
                    continue
                for row in rows if isinstance(rows, list) else ():
                    try:
                        endpoint = check_endpoint(row[2])
                    except (ProtocolError, TypeError, IndexError):
                        continue
                    if endpoint not in tried:
                        named.add(endpoint)
            tried |= named
            answers = self.dialer.hello_all(sorted(named), min(self.answer_s, 2.0))
            frontier = [w for w in answers.values()
                        if isinstance(w, Welcome) and w.node_id not in found]
            found.update((w.node_id, w) for w in frontier)
            for endpoint, outcome in answers.items():
                if isinstance(outcome, BaseException):
                    # before at INFO: a stuck peer was left out of the job unsaid
                    log.warning("peer %s is listed by the overlay but did not answer (%s): "
                                "this job runs without it", endpoint, outcome)
        return list(found.values())

    def call(self, ref: ServiceRef, kind: int, payload: Any = wm.NO_PAYLOAD, *,
             timeout_s: float = CALL_S) -> Any:
        """A request to a peer; a peer that cannot answer in time, or whose connection is
        down for ``GONE_S``, is ``NodeLost`` (no manager tells us it died)."""
        fut = self.node.request(ref.node, ref.service, kind, payload,
                                timeout_s=min(timeout_s, self.answer_s))
        try:
            while not fut.done():
                futures.wait([fut], GONE_S / 10)
                down = self.node.link_down_for(ref.node)
                if not fut.done() and down is not None and down > GONE_S:
                    raise NodeLost(ref.node, f"peer {ref.node}: its connection is down for "
                                             f"{down:.1f} s")
            return fut.result(0)
        except ActorpyTimeout as exc:
            raise NodeLost(ref.node, f"peer {ref.node} is taken as gone: {exc}") from None
        finally:
            if not fut.done():
                self.node.forget(fut)


class OverlayRun(ClusterRun):
    """``ClusterRun`` on peers that are already running: each gets the job instead of
    being started, and is told the job ended instead of being stopped."""

    def __init__(self, job: Any, client: OverlayClient, members: list[Welcome],
                 init: dict[str, Any], **options: Any) -> None:
        super().__init__(job, client, len(members), init, **options)
        # every driver takes the peers in one order (their node ids), so of drivers that
        # submit at once the first to reach the first peer gets them all and the others
        # are refused there, holding none: in the order each found them (its bootstrap's
        # first), each took some, was refused by another, and none ran its job
        self.members = sorted(members, key=lambda m: m.node_id)
        # the peers ran other jobs before: this run's calls carry a token of their own
        self.spec = dataclasses.replace(self.spec, run=secrets.randbits(62) + 1)

    def start_peers(self) -> None:
        for index, member in enumerate(self.members):
            ref = ServiceRef(member.node_id, PEER_SERVICE)
            self.refs.append(ref)
            self.addresses.append(member.address)
            try:
                self.cluster.call(ref, PeerKind.JOB, (self.spec, self.job.config, index,
                                                      self.data), timeout_s=CALL_S)
            except NodeLost as exc:     # before: the whole job failed
                self.lose(index, exc)

    def stop(self, wait_s: float = 10.0) -> None:
        """The job is over: each live peer drops its runner and goes on serving the
        overlay (never stopped, never leaving: the overlay outlives its jobs). A peer taken
        as lost is told too, briefly: one that was only paused or slow trained on, and held
        the job until its driver's lease lapsed (the next job was refused meanwhile). The lost
        share ``LOST_END_S`` between them, as ``ClusterRun.stop``'s peers share its wait."""
        lost_until = time.monotonic() + min(wait_s, LOST_END_S)
        for i, ref in enumerate(self.refs):
            left = max(lost_until - time.monotonic(), STOP_MIN_S) if i in self.lost else wait_s
            try:
                self.cluster.call(ref, PeerKind.END, self.spec.run, timeout_s=left)
            except ActorpyError as exc:
                log.debug("ending the job on peer %d: %s", i, exc)

    def add_peer(self, node: Any = None) -> str:
        raise ActorpyError("a job on standalone peers cannot grow: start the job again "
                           "after more `actorpy peer --bootstrap ...` have joined")


def run_overlay(job: Any, address: str, init: dict[str, Any], *,
                secret: str | bytes | None = None, secret_file: str | None = None,
                data: Callable[[int], Any] | None = None,
                timeout_s: float = 300.0, on_poll: Callable[[Any, float], None] | None = None,
                hello_s: float = 10.0) -> RunResult:
    """``Job.run_overlay``: run ``job`` on every standalone peer reachable from ``address``
    and return its ``RunResult``.

    Raises:
        as ``Job.run_overlay``.
    """
    check_timeout(timeout_s)   # before: a str failed at the subtraction below
    started = time.monotonic()
    with OverlayClient(address, secret=secret, secret_file=secret_file,
                       hello_s=min(hello_s, timeout_s)) as client:
        members = client.members()
        left = timeout_s - (time.monotonic() - started)
        if left <= 0:   # before: a ConfigError blaming a negative timeout_s never given
            raise ActorpyTimeout(f"job {job.name!r}: finding the peers through {address} took "
                                 f"all of timeout_s={timeout_s:g} s; raise timeout_s")
        return OverlayRun(job, client, members, init, data=data, timeout_s=left,
                          on_poll=on_poll).run()

"""A standalone peer: one process, one core node with no manager, one ``PeerService``.

    peer = StandalonePeer("tcp://10.0.0.5:7400", Security.curve(secret)).start()
    peer.join("tcp://10.0.0.4:7400", timeout_s=10)     # through any live peer; none: first
    ...                                                # serves the overlay and its jobs
    peer.close()

Its node authenticates with CURVE like every node of a multi-host cluster (every member
derives the same key from the cluster secret), but no manager tells it who is where:
members are learned by endpoint (``dialer.Dialer``), and a dead peer is noticed by the
overlay itself (its PINGs and rpc timeouts), as in the simulator. ``actorpy peer`` (the
``apps.p2p_peer`` app) runs one; ``Job.run_overlay`` submits a job to such peers. A job is
leased to its driver: gone for ``lease_s`` (``shell.DRIVER_LEASE_S``), it loses the job.
"""
from __future__ import annotations

import math
import os
import random
from typing import Any

from actorpy.config import Config
from actorpy.errors import ActorpyError, ConfigError, ProtocolError
from actorpy.ids import NodeId, new_node_id
from actorpy.runtime.address import advertise_host
from actorpy.runtime.host import ServiceHost
from actorpy.runtime.node import Node
from actorpy.wire.auth import Security

from .dialer import FORGET_AFTER_S, HELLO_SERVICE, PEER_SERVICE, Dialer, check_endpoint
from .job import TRAINING_OVERLAY
from .kademlia.events import KademliaConfig
from .shell import DRIVER_LEASE_S, PeerKind, PeerService

#: the overlay settings a standalone peer starts with (a job brings its own, same ksize)
STANDALONE_OVERLAY = KademliaConfig(**{**TRAINING_OVERLAY, "rpc_timeout_s": 0.5,
                                       "replication": 3})
CALL_S = 30.0


def zmq_bind(bind: str) -> str:
    """What ZeroMQ binds for ``--bind tcp://HOST:PORT``; port 0 or ``*``: any free one.

    >>> zmq_bind("tcp://127.0.0.1:0"), zmq_bind("tcp://10.0.0.4:7400")
    ('tcp://127.0.0.1:*', 'tcp://10.0.0.4:7400')

    Raises:
        ConfigError: not a tcp://HOST:PORT.
    """
    host, _, port = bind[len("tcp://"):].rpartition(":") if bind.startswith("tcp://") \
        else ("", "", "")
    if not host or not (port == "*" or port.isdigit() and int(port) < 65536) \
            or len(bind) > 128:
        raise ConfigError(f"--bind must be tcp://HOST:PORT (PORT 0: any free port), "
                          f"not {bind!r}")
    return f"tcp://{host}:{'*' if port == '*' or int(port) == 0 else int(port)}"


def advertised(bound: str, host: str | None, bootstrap: str | None) -> str:
    """Where other peers reach a node bound at ``bound`` (its real port): ``host`` if given,
    else the bound host, else (bound to all interfaces) the one that routes to ``bootstrap``.

    Raises:
        ConfigError: bound to all interfaces with no way to tell which one others use.
    """
    bound_host, _, port = bound[len("tcp://"):].rpartition(":")
    if host is None and bound_host in ("0.0.0.0", "*", "[::]"):
        if bootstrap is None:
            raise ConfigError("a peer bound to all interfaces needs --host HOST: the address "
                              "other peers dial to reach it")
        host = advertise_host(bootstrap)
    endpoint = f"tcp://{host or bound_host}:{port}"
    try:
        return check_endpoint(endpoint)
    except ProtocolError as exc:
        raise ConfigError(f"--host: {exc}") from None


class StandalonePeer:
    """One peer with no manager (see the module docstring).

    Args:
        bind: ``tcp://HOST:PORT`` to listen on (port 0: any free port; see ``endpoint``).
        security: CURVE with the cluster secret (``address.security_for``).
        host: the host other peers dial, when it is not the bound one.
        bootstrap: the peer ``join`` will use (only to pick ``host`` on 0.0.0.0).
        overlay: the overlay's settings until a job brings its own.
        config: the node's wire settings (default: from the environment).
        forget_after_s: forget a peer whose connection has been down this long.
        lease_s: end a job once the connection to its driver has been down this long.
    """

    def __init__(self, bind: str, security: Security, *, host: str | None = None,
                 bootstrap: str | None = None,
                 overlay: KademliaConfig = STANDALONE_OVERLAY,
                 config: Config | None = None,
                 forget_after_s: float = FORGET_AFTER_S,
                 lease_s: float = DRIVER_LEASE_S) -> None:
        if not 0 < lease_s < math.inf:
            raise ConfigError(f"the driver lease must be a finite number of seconds > 0, "
                              f"not {lease_s}")
        config = config or Config.from_env()
        rng = random.Random(int.from_bytes(os.urandom(8), "big"))
        self.node_id: NodeId = new_node_id(rng, "p")
        self.node = Node.from_config(self.node_id, zmq_bind(bind), security, config,
                                     handover=True)
        try:
            self.endpoint = advertised(self.node.address, host, bootstrap)
        except ConfigError:
            self.node.close()
            raise
        self.node.start()
        self.dialer = Dialer(self.node, self.endpoint, forget_after_s)
        # the last service id is the handshake's (a node-level handler), never a service
        self.host = ServiceHost(self.node, config, None, max_services=HELLO_SERVICE - 1,
                                names=False)
        spec = (PeerService, (overlay, rng.getrandbits(32), 0, None, None),
                {"dialer": self.dialer, "lease_s": lease_s}, "")
        self.ref = self.host.start_local(spec, self.node_id).result(CALL_S)
        if self.ref.service != PEER_SERVICE:
            raise ActorpyError(f"the peer service got id {self.ref.service}, not "
                               f"{PEER_SERVICE}: it must be the node's first service")

    def join(self, bootstrap: str, timeout_s: float = 10.0) -> int:
        """Join the overlay through the peer at ``bootstrap``; returns how many contacts
        the join found.

        Raises:
            ConfigError: a bad address. AuthError: another secret there.
            ActorpyTimeout: nobody answered in time.
        """
        welcome = self.dialer.hello(bootstrap, timeout_s)
        found = self.call(PeerKind.JOIN, (welcome.kad_id, welcome.address), timeout_s)
        if not found:
            raise ActorpyError(f"the peer at {bootstrap} answered hello but not the overlay "
                               "join; try again, or join through another peer")
        return found

    def call(self, kind: PeerKind, payload: Any = None, timeout_s: float = CALL_S) -> Any:
        """A request to this process's own peer service (``PeerKind``)."""
        return self.node.call(self.node_id, PEER_SERVICE, kind, payload, timeout_s=timeout_s)

    def status(self) -> dict[str, Any]:
        """The peer service's ``STATUS`` (address, routing table, keys, phase, step...)."""
        return self.call(PeerKind.STATUS)

    def leave(self, timeout_s: float = 5.0) -> None:
        """Hand the keys stored here to the next closest peers and tell the contacts."""
        self.call(PeerKind.LEAVE, None, timeout_s)

    def close(self) -> None:
        self.host.close()
        self.node.close(linger_ms=0)

"""Where standalone peers listen: with no manager to ask, a node learns each member's tcp
endpoint from the members themselves, and finds out who listens at an address by asking.

- ``Dialer`` keeps ``node id -> endpoint`` and opens the core link to each (``Node.add_peer``).
  An endpoint always comes from a payload, so it is only a hint for dialling: it must be a
  ``tcp://HOST:PORT`` of sane length, and the identity trusted is still the authenticated
  sender of each message (CURVE: membership is the cluster secret). A node's own claim
  about itself replaces what was known; a third party's claim only fills a gap.
- ``hello(address)``: who listens at ``address``? The node sends ``PeerKind.HELLO`` (its own
  endpoint) to the peer service there under a placeholder node id, and the peer answers with
  a ``WELCOME`` cast carrying its Kademlia id and overlay address; the sender of that answer
  (authenticated) is the real node id. A request cannot do this: a reply is only accepted
  from the node it was sent to, whose id is what we are asking.
- Dead peers are the overlay's business (its PINGs and rpc timeouts drop them from the
  routing table). The dialer only forgets a node whose link has been down for
  ``forget_after_s``, so that what is queued for a dead node does not pile up.
"""
from __future__ import annotations

import itertools
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from actorpy.errors import ActorpyTimeout, AuthError, ConfigError, ProtocolError
from actorpy.ids import NODE_ID_BYTES, NodeId
from actorpy.runtime.node import Node
from actorpy.runtime.receive import decode_payload

from .shell import PeerKind

log = logging.getLogger(__name__)

#: the peer service of a standalone peer process (the first service its node starts)
PEER_SERVICE = 1
#: the service id the handshake answers go to (a node-level handler, never a service)
HELLO_SERVICE = 65_535
#: hints accepted per message (a NODES reply names at most ksize contacts, plus the sender)
MAX_HINTS = 65
MAX_ENDPOINT_CHARS = 128
#: a node whose link has been down this long is forgotten, with what was queued for it,
#: until a hint names it again (with no manager to declare deaths, its queue would grow)
FORGET_AFTER_S = 30.0
_TCP = re.compile(r"^tcp://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_NODE_ID = re.compile(r"^[\x21-\x7e]{1,%d}$" % NODE_ID_BYTES)


def check_endpoint(value: object) -> str:
    """``value`` if it is a dialable ``tcp://HOST:PORT`` (port 1-65535, no wildcard).

    >>> check_endpoint("tcp://10.0.0.5:7400")
    'tcp://10.0.0.5:7400'

    Raises:
        ProtocolError: anything else (a ConfigError where a user typed it: see callers).
    """
    if type(value) is not str or len(value) > MAX_ENDPOINT_CHARS:  # type: ignore[arg-type]
        raise ProtocolError(f"an endpoint must be a str of <= {MAX_ENDPOINT_CHARS} chars")
    match = _TCP.match(value)  # type: ignore[arg-type]
    if match is None or not 0 < int(match.group(2)) < 65536 or match.group(1) in ("0.0.0.0", "*"):
        raise ProtocolError(f"{value!r} is not a dialable tcp://HOST:PORT")
    return value  # type: ignore[return-value]


def check_node_id(value: object) -> NodeId:
    if type(value) is not str or not _NODE_ID.match(value):  # type: ignore[arg-type]
        raise ProtocolError(f"a node id must be 1 to {NODE_ID_BYTES} printable ASCII chars")
    return NodeId(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Welcome:
    """Who answered a ``hello``: its node id, Kademlia id, overlay address and endpoint."""

    node_id: NodeId
    kad_id: int
    address: str
    endpoint: str

#: how many replaced nodes a dialer remembers (for a lease's words)
MAX_REPLACED = 64


class Dialer:
    """A standalone node's endpoint book and handshake (see the module docstring).

    Args:
        node: this process's node (started).
        endpoint: where others reach this node (``tcp://HOST:PORT``).
        forget_after_s: forget a node whose link has been down this long.
    """

    def __init__(self, node: Node, endpoint: str,
                 forget_after_s: float = FORGET_AFTER_S) -> None:
        self.node = node
        self.endpoint = check_endpoint(endpoint)
        self._lock = threading.Lock()
        self._endpoints: dict[NodeId, str] = {node.node_id: self.endpoint}
        self._waiting: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._tokens = itertools.count(int.from_bytes(os.urandom(4), "big") << 16)
        node.on(HELLO_SERVICE, int(PeerKind.WELCOME), self._welcome)
        self.forget_after_s = forget_after_s
        #: nodes forgotten because another claimed their endpoint: id -> (that one, endpoint)
        self.replaced: dict[NodeId, tuple[NodeId, str]] = {}
        self._sweep_s = min(5.0, forget_after_s / 2)
        node.call_later(self._sweep_s, self._sweep)

    # ------------------------------------------------------------------ the book
    def knows(self, node_id: str) -> bool:
        return node_id in self._endpoints

    def replacement(self, node_id: str) -> str | None:
        """Why ``node_id`` was forgotten if another node claimed its endpoint, else None."""
        found = self.replaced.get(NodeId(node_id))
        return None if found is None else f"{found[0]} now listens at its endpoint {found[1]}"

    def endpoint_of(self, node_id: str) -> str | None:
        return self._endpoints.get(NodeId(node_id))

    def learn(self, node_id: NodeId, endpoint: str, *, claimed_by_itself: bool) -> bool:
        """Record where ``node_id`` listens and open the link to it; returns whether that is
        news. A node's claim about itself replaces an older one; a third party's claim only
        fills a gap.

        Raises:
            ProtocolError: ZeroMQ cannot connect to ``endpoint`` (nothing learned).
        """
        with self._lock:
            known = self._endpoints.get(node_id)
            if known == endpoint or (known is not None and not claimed_by_itself) \
                    or node_id == self.node.node_id:
                return False
            # One node listens at an address: a node claiming it for itself replaces any
            # other recorded there (a peer restarted at its --bind: before, the dead one's
            # id stayed, its link up again to the new process, and jobs left the new one out)
            stale = [n for n, e in self._endpoints.items() if e == endpoint and n != node_id
                     and n != self.node.node_id] if claimed_by_itself else []
            for gone in stale:
                del self._endpoints[gone]
                self.replaced[gone] = (node_id, endpoint)
                while len(self.replaced) > MAX_REPLACED:
                    del self.replaced[next(iter(self.replaced))]
            self._endpoints[node_id] = endpoint
        for gone in stale:
            self.node.forget_peer(gone)
            log.info("forgot peer %s: %s now listens at %s", gone, node_id, endpoint)
        try:
            self.node.add_peer(node_id, endpoint, "peer", watch=True)
        except ConfigError as exc:
            with self._lock:
                if self._endpoints.get(node_id) == endpoint:
                    del self._endpoints[node_id]
            raise ProtocolError(f"cannot dial {node_id} at {endpoint!r}: {exc}") from None
        return True

    def learn_hints(self, sender: NodeId, hints: object) -> None:
        """Learn from a message's hints: ``[[node id, endpoint], ...]``, the sender's first.

        Raises:
            ProtocolError: malformed hints (nothing learned).
        """
        if type(hints) is not list or not 0 < len(hints) <= MAX_HINTS:  # type: ignore[arg-type]
            raise ProtocolError(f"hints must be a list of 1 to {MAX_HINTS} pairs")
        pairs = []
        for item in hints:  # type: ignore[union-attr]
            if type(item) not in (list, tuple) or len(item) != 2:
                raise ProtocolError("each hint must be a (node id, endpoint) pair")
            pairs.append((check_node_id(item[0]), check_endpoint(item[1])))
        if pairs[0][0] != sender:
            raise ProtocolError("the first hint must be the sender's own endpoint")
        for i, (node_id, endpoint) in enumerate(pairs):
            self.learn(node_id, endpoint, claimed_by_itself=i == 0)

    def hints(self, node_ids: list[str]) -> list[list[str]]:
        """The hints a message carries: this node's endpoint, then each known one named."""
        out = [[self.node.node_id, self.endpoint]]
        for node_id in node_ids:
            endpoint = self._endpoints.get(NodeId(node_id))
            if endpoint is not None and node_id != self.node.node_id:
                out.append([node_id, endpoint])
        return out[:MAX_HINTS]

    def _sweep(self) -> None:
        """Forget the nodes whose link has been down too long (on the I/O thread)."""
        for node_id in list(self._endpoints):
            down = self.node.link_down_for(node_id)
            if node_id != self.node.node_id and down is not None and down > self.forget_after_s:
                with self._lock:
                    endpoint = self._endpoints.pop(node_id, None)
                self.node.forget_peer(node_id)
                log.info("forgot peer %s at %s: its connection is down for %.0f s", node_id,
                         endpoint, down)
        if not self.node.closed:
            self.node.call_later(self._sweep_s, self._sweep)

    # ------------------------------------------------------------------ handshake
    def hello(self, address: str, timeout_s: float) -> Welcome:
        """Who listens at ``address``? (see the module docstring)

        Raises:
            ConfigError: ``address`` is not a tcp://HOST:PORT.
            AuthError: the peer there refused our handshake (another secret).
            ActorpyTimeout: nobody answered within ``timeout_s``.
        """
        [outcome] = self.hello_all([address], timeout_s).values()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def hello_all(self, addresses: list[str], timeout_s: float
                  ) -> dict[str, Welcome | BaseException]:
        """``hello`` to several addresses at once; each gets a Welcome or the error."""
        try:
            for address in addresses:
                check_endpoint(address)
        except ProtocolError:
            raise ConfigError(f"a peer address must be tcp://HOST:PORT (a host and a port "
                              f"other peers can dial), not {address!r}") from None
        pending: dict[str, tuple[NodeId, int, threading.Event, list[Any]]] = {}
        out: dict[str, Welcome | BaseException] = {}
        aliases: list[NodeId] = []
        with self._lock:
            linked = {e: n for n, e in self._endpoints.items() if n != self.node.node_id}
        try:
            for address in addresses:
                token = next(self._tokens)
                event, box = threading.Event(), [address]
                self._waiting[token] = (event, box)
                # An address we already have a link to is asked over that link: a second
                # connection from this node would take the peer's route to us over (ZeroMQ
                # hands an identity to its newest connection), and closing it afterwards
                # left the peer no route back: every later answer to us was lost.
                via = linked.get(address)
                if via is None:
                    via = NodeId(f"?{token & 0xFFFFFFFFFFFF:x}"[:NODE_ID_BYTES])
                    aliases.append(via)
                    self.node.add_peer(via, address, "hello", watch=True)
                pending[address] = (via, token, event, box)
                self.node.send(via, PEER_SERVICE, int(PeerKind.HELLO), (token, self.endpoint),
                               from_service=HELLO_SERVICE)
            deadline = time.monotonic() + timeout_s
            while pending:
                for address, (alias, token, event, box) in list(pending.items()):
                    failure = self.node.auth_failure(alias)
                    if event.is_set():
                        out[address] = box[1]
                    elif failure is not None:
                        out[address] = AuthError(failure.replace(f" with {alias} at ", " with "))
                    elif time.monotonic() > deadline and self.node.link_ever_up(alias):
                        # before: "no peer answered ... is an `actorpy peer` running there?"
                        # of a live peer stuck in a callback of a job that ended without it
                        out[address] = ActorpyTimeout(
                            f"the peer at {address} took the connection (it holds the "
                            f"secret) but did not answer within {timeout_s:g} s: its peer "
                            "service is busy, most likely still in a callback (push, pull) "
                            "of an earlier job that never returned; stop that `actorpy peer` "
                            "(its supervisor restarts it), or join through another one")
                    elif time.monotonic() > deadline:
                        out[address] = ActorpyTimeout(
                            f"no peer answered at {address} within {timeout_s:g} s: is an "
                            "`actorpy peer` running there, and reachable from here?")
                    else:
                        continue
                    del pending[address]
                if pending:
                    next(iter(pending.values()))[2].wait(0.02)
        finally:
            for alias, token, _, _ in pending.values():
                self._waiting.pop(token, None)
            for alias in aliases:
                self.node.forget_peer(alias)
        return out

    def _welcome(self, msg: Any) -> None:
        """WELCOME (I/O thread): ``(token, kademlia id, overlay address)``."""
        payload = decode_payload(msg, "a WELCOME")
        if type(payload) is not tuple or len(payload) != 3 or type(payload[0]) is not int:
            raise ProtocolError(f"a WELCOME from {msg.sender!r} is not (token, id, address)")
        waiting = self._waiting.pop(payload[0], None)
        if waiting is None:
            return  # late, or not ours
        event, box = waiting
        address = box[0]
        node_id = check_node_id(msg.sender)
        box.append(Welcome(node_id, int(payload[1]), str(payload[2]), address))
        # the address we dialled is where it listens (its own claim may name another host)
        self.learn(node_id, address, claimed_by_itself=True)
        event.set()


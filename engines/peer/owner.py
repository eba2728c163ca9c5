"""The owner side of a P2P job: a peer serves GET and PUSH for the keys it is closest to.

An owner runs ``pull`` on each update pushed to it, writes the result locally with the next
clock and stores it on the key's ``replication`` closest peers, with at most one replication
in flight per key (writes made meanwhile go out with the next one). A peer asked for a key it
should own but does not hold yet (it joined closer to the key than the old owner) fetches it
from the overlay and answers MISSING, so the pusher retries shortly.

Owner changes are not serialised: while peers disagree on who is closest (a join or a death
not yet noticed by all), two peers may each accept updates, and replicas keep the highest
version (clock, writer), so the other branch's updates are lost. SGD tolerates this, as
Hippo's elastic PS does (papers.md).
"""
from __future__ import annotations

import logging
import traceback
from enum import IntEnum
from typing import Any, Callable

from .context import JobSpec, OwnerStore
from .kademlia.events import Done, Effects
from .kademlia.ids import KadId, key_id
from .kademlia.messages import Call
from .kademlia.node import KademliaNode
from .kademlia.routing import Contact
from .kademlia.values import Blob

log = logging.getLogger(__name__)


class Method(IntEnum):
    """The P2P engine's CALL methods (this engine's own enum)."""

    GET = 1      # args (key,) -> OK (clock,) + value
    PUSH = 2     # args (key, step) + update -> OK (clock,) + the new value


class Status(IntEnum):
    """How an owner answers."""

    OK = 1
    NOT_OWNER = 2     # someone is closer to the key: look the owner up again
    MISSING = 3       # the owner does not hold the key (yet): retry after ``retry_s``
    ERROR = 4         # pull raised: args (type, message)


Then = Callable[[Done, float, Effects], None]
StartOp = Callable[[tuple[int, Effects], Then, Effects], None]


class KeyOwner:
    """Serves the keys one peer owns.

    Args:
        spec: the job (its ``pull``).
        node: the peer's node (its storage holds the keys).
        start_op: registers a node operation's continuation with the peer's runner, so its
            ``Done`` comes back here.

    Attributes:
        applied: updates folded in here, per key.
        error: the last ``pull`` failure here (type, message, traceback), if any.
    """

    def __init__(self, spec: JobSpec, node: KademliaNode, start_op: StartOp) -> None:
        self.spec = spec
        self.node = node
        self._start_op = start_op
        self.applied: dict[str, int] = {}
        self.error: tuple[str, str, str] | None = None
        self._replicating: set[int] = set()
        self._dirty: set[int] = set()
        self._adopting: set[int] = set()

    def on_call(self, sender: Contact, call: Call, now: float,
                 eff: Effects) -> tuple[int, tuple[Any, ...], Any]:
        """The node's CALL handler: GET and PUSH for the keys this peer owns."""
        if call.method not in (Method.GET, Method.PUSH) or not call.args \
                or type(call.args[0]) is not str or key_id(call.args[0]) != call.key:
            return Status.ERROR, ("ProtocolError", "malformed P2P engine call"), None
        step = call.args[1] if len(call.args) > 1 and type(call.args[1]) is int else -1
        update = call.value.to_value() if call.value is not None else None
        if call.method == Method.PUSH and update is None:
            return Status.ERROR, ("ProtocolError", "PUSH without an update"), None
        return self.serve(sender, call.args[0], call.key, Method(call.method), step, update,
                           now, eff)

    def _is_owner(self, kid: KadId) -> bool:
        closest = self.node._closest(kid)[:1]
        return not closest or self.node.node_id ^ kid < closest[0].node_id ^ kid

    def serve(self, sender: Contact, name: str, kid: KadId, method: Method, step: int,
               update: Any, now: float, eff: Effects) -> tuple[int, tuple[Any, ...], Any]:
        if self.node.leaving:
            # our keys are being handed on: a write taken now would miss the copy handed
            # over; the pusher retries and, once our LEAVE reached it, asks the next owner
            return Status.MISSING, (), None
        if not self._is_owner(kid):
            return Status.NOT_OWNER, (), None
        record = self.node.storage.get(kid, now)
        if record is None:
            self._adopt(kid, now, eff)
            return Status.MISSING, (), None
        if method == Method.GET:
            return Status.OK, (record.clock,), record.value
        read = lambda n: ((r.value.to_value(), r.clock)  # noqa: E731
                          if (r := self.node.storage.get(key_id(n), now)) is not None else None)
        store = OwnerStore(read, sender.address, step)
        try:
            self.spec.pull(store, {name: update})
        except Exception as exc:  # user code: the pusher fails with it
            self.error = (type(exc).__qualname__, str(exc), traceback.format_exc())
            log.error("peer %s: pull of %s failed: %s", self.node.address, name, exc)
            return Status.ERROR, (type(exc).__qualname__, str(exc)[:200]), None
        for key, value in store.written.items():
            written = key_id(key)
            held = self.node.storage.get(written, now)
            clock = 0 if held is None else held.clock + 1
            self.node.storage.put(written, Blob.of(value), now, self.node.config.ttl_s,
                                  is_origin=True, clock=clock, writer=self.node.node_id)
            self._replicate(written, now, eff)
        self.applied[name] = self.applied.get(name, 0) + 1
        record = self.node.storage.get(kid, now)
        assert record is not None
        return Status.OK, (record.clock,), record.value

    def _adopt(self, kid: KadId, now: float, eff: Effects) -> None:
        """We are closest to a key we do not hold: fetch it from its other holders."""
        if kid in self._adopting:
            return
        self._adopting.add(kid)

        def fetched(done: Done, when: float, e: Effects) -> None:
            self._adopting.discard(kid)
            if done.blob is not None and self.node.storage.get(kid, when) is None:
                self.node.storage.put(kid, done.blob, when, self.node.config.ttl_s,
                                      is_origin=True, clock=done.clock, writer=KadId(0))
                self._replicate(kid, when, e)
        self._start_op(self.node.get(kid, now), fetched, eff)

    def _replicate(self, kid: KadId, now: float, eff: Effects) -> None:
        """Store the newest local copy on the key's closest peers; one round at a time."""
        if kid in self._replicating:
            self._dirty.add(kid)
            return
        record = self.node.storage.get(kid, now)
        if record is None:
            return

        def replicated(done: Done, when: float, e: Effects) -> None:
            self._replicating.discard(kid)
            if kid in self._dirty:
                self._dirty.discard(kid)
                self._replicate(kid, when, e)
        self._replicating.add(kid)
        self._start_op(self.node.set(kid, record.value, now, clock=record.clock), replicated, eff)

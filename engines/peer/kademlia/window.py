"""A cap on a node's requests in flight to each contact (``KademliaConfig.max_in_flight``).

A step with many keys asks each owner once per key at the same instant (a lookup per key
first, then a PUSH per key, each answered after a replication round of STOREs): hundreds
of requests land in one peer's inbox at once, and the last ones wait there for all the
others. Past a few hundred they waited longer than their timeouts (PING and FIND_NODE from
50 ms on): a live peer missed its replies, was given up on, and every key it held with us
was stored again (a lookup and STOREs per key), which made the next queue longer still: a
job of 400 keys on 4 peers did not end in 90 s, where 200 took 5 s (docs/peer.md,
"Many keys").

So a node keeps at most ``max_in_flight`` requests out to each contact, and queues the
others (in order) until one is answered or times out; a request's timeout starts when it
is sent. CALLs have a lane of their own: an owner answers a CALL only after its STOREs
were answered, so a CALL never waits behind a request that waits for it (two owners each
pushing to the other with full lanes would have). A contact evicted (or gone) takes its
queued requests with it: they are given up at once, as a timeout would have.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .events import Effects, Send, SetTimer, TimerKind
from .messages import Kind, Message
from .routing import Contact

if TYPE_CHECKING:
    from .ops import NodeOps

Lane = tuple[int, bool]         # (contact's id, a CALL)


@dataclass
class _Pending:
    contact: Contact
    kind: Kind
    op_id: int | None
    make: Callable[[int], Message]
    key: int = 0
    sent_s: float = 0.0
    limit_s: float = 0.0        # the longest wait: rpc_timeout_s (+ a value's allowance)
    first_s: float = 0.0        # when its first try was sent (it may be a retry)
    retry: int | None = None    # timed out (kept in ``_late``): the rpc id of its retry
    final: bool = False         # ... its last try: no answer by limit_s evicts


class Window:
    """Requests in flight per contact and lane, the rest queued (see the module docstring).

    Args:
        node: the node whose ``_pending`` requests these are.
        limit: the most in flight per contact and lane (0: no cap).
    """

    def __init__(self, node: NodeOps, limit: int) -> None:
        self._node = node
        self.limit = limit
        self._out: dict[Lane, int] = {}
        self._slots: dict[int, Lane] = {}           # rpc id in flight -> its lane
        self._queued: dict[Lane, deque[tuple[int, float]]] = {}     # (rpc id, timeout)
        self._heard: dict[int, float] = {}      # contact -> when it last answered us

    def heard(self, node_id: int, now: float) -> None:
        """``node_id`` answered one of our requests (late or not)."""
        self._heard[node_id] = now

    def busy(self, node_id: int, sent_s: float) -> bool:
        """Whether ``node_id`` answered us after ``sent_s``: a request sent then that timed
        out waits behind others in its inbox (it is no sign of death)."""
        return self._heard.get(node_id, -1.0) > sent_s

    def queued(self) -> int:
        """How many requests wait for a slot (all contacts)."""
        return sum(len(q) for q in self._queued.values())

    def send(self, contact: Contact, rpc_id: int, message: Message, timeout_s: float,
             eff: Effects) -> None:
        """Send a request now (its timeout armed), or queue it until its lane has room."""
        lane = (contact.node_id, message.KIND == Kind.CALL)
        if self.limit > 0:
            if self._out.get(lane, 0) >= self.limit or lane in self._queued:
                self._queued.setdefault(lane, deque()).append((rpc_id, timeout_s))
                return
            self._out[lane] = self._out.get(lane, 0) + 1
            self._slots[rpc_id] = lane
        eff.sends.append(Send(contact.address, message))
        eff.timers.append(SetTimer(timeout_s, TimerKind.RPC_TIMEOUT, rpc_id))

    def done(self, rpc_id: int, now: float, eff: Effects) -> None:
        """Request ``rpc_id`` was answered, timed out or dropped: its slot goes to the next
        request queued for that contact, if any (sent now: its wait starts now)."""
        lane = self._slots.pop(rpc_id, None)
        if lane is None:
            return
        self._out[lane] -= 1
        queue = self._queued.get(lane)
        pending = self._node._pending
        while queue and self._out[lane] < self.limit:
            queued, timeout_s = queue.popleft()
            request = pending.get(queued)
            if request is None:             # answered through its first try, or given up
                continue
            if request.first_s == request.sent_s:   # a first try: its wait starts now
                request.first_s = now
            request.sent_s = now
            self._out[lane] += 1
            self._slots[queued] = lane
            eff.sends.append(Send(request.contact.address, request.make(queued)))
            eff.timers.append(SetTimer(timeout_s, TimerKind.RPC_TIMEOUT, queued))
        if not queue:
            self._queued.pop(lane, None)
        if not self._out[lane]:
            del self._out[lane]

    def forget(self, node_id: int, now: float, eff: Effects) -> None:
        """``node_id`` was evicted or left: its queued requests are given up now (it will
        not answer them), and its lanes are cleared."""
        node = self._node
        self._heard.pop(node_id, None)
        for lane in [(node_id, False), (node_id, True)]:
            self._out.pop(lane, None)
            for rpc_id, _ in self._queued.pop(lane, ()):
                request = node._pending.pop(rpc_id, None)
                if request is None:
                    continue
                op = node._ops.get(request.op_id) if request.op_id is not None else None
                if op is not None:
                    op.in_flight -= 1
                node._give_up(request, op, now, eff)
        for rpc_id in [r for r, lane in self._slots.items() if lane[0] == node_id]:
            del self._slots[rpc_id]

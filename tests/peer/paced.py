"""A simulated peer on a link of a given pace (the value allowance's tests, ``sizes.py``)."""
from __future__ import annotations

from typing import Any

from engines.peer.kademlia.events import Effects
from engines.peer.kademlia.sim import SimNetwork


class PacedLink:
    """Wraps a live simulated node (or a peer driving one): a message that carries a value
    leaves once its bytes went out at ``rate`` bytes a second, the rest at once. ``serial``:
    such messages leave one after another (an uplink: a resent value queues behind the
    first), else each is paced on its own. ``queue_all`` (serial): small messages wait
    behind the values ahead of them too, as on one TCP connection for every peer.
    ``queue_pair`` (serial): a small message waits behind the values ahead of it to the
    same peer only (one TCP connection per peer, as the core's wire has, small packets
    slipping between the others' at the shaped link). ``only_to``: only the sends to these
    peers go over the link (the others at once): a fast peer's side of a slow peer's link.

    Attach it with ``net.attach(address, PacedLink(net, address, inner, rate))``."""

    def __init__(self, net: SimNetwork, address: str, inner: Any, rate: float,
                 serial: bool = False, queue_all: bool = False,
                 queue_pair: bool = False, only_to: frozenset[str] | None = None) -> None:
        self.net, self.address, self.inner = net, address, inner
        self.only_to = only_to
        self.rate, self.queue_all, self.queue_pair = rate, queue_all, queue_pair
        self.serial = serial or queue_all or queue_pair
        self.busy_until = 0.0
        self.pair_until: dict[str, float] = {}   # destination -> when its last value is out

    def _paced(self, effects: Effects) -> Effects:
        now_sends = []
        for send in effects.sends:
            if self.only_to is not None and send.address not in self.only_to:
                now_sends.append(send)      # not over the slow link
                continue
            value = getattr(send.message, "value", None)
            now = self.net.clock.now()
            behind = self.busy_until if self.queue_all else \
                self.pair_until.get(send.address, 0.0) if self.queue_pair else 0.0
            if value is None and behind <= now:
                now_sends.append(send)
                continue
            nbytes = value.nbytes if value is not None else 0
            start = max(self.busy_until, now) if self.serial else now
            done = start + nbytes / self.rate if value is not None else behind
            if self.serial and value is not None:
                self.busy_until = done
            if self.queue_pair and value is not None:
                self.pair_until[send.address] = done
            self.net.clock.call_later(done - now, lambda s=send: self.net.apply(
                self.address, Effects(sends=[s])))
        effects.sends = now_sends
        return effects

    def receive(self, sender: str, message: Any, now: float, frames: Any = ()) -> Effects:
        return self._paced(self.inner.receive(sender, message, now, frames))

    def on_timer(self, kind: Any, token: int, now: float) -> Effects:
        return self._paced(self.inner.on_timer(kind, token, now))

    def run_op(self, begin: Any, max_s: float = 600.0) -> Any:
        """``SimNetwork.run_op`` with the operation's first sends paced too."""
        return self.net.wait_for(self.address, self.start(begin), max_s)

    def start(self, begin: Any) -> int:
        """Begin an operation whose sends go over this link; its op id (not waited for)."""
        op_id, effects = begin(self.inner, self.net.clock.now())
        self.net.apply(self.address, self._paced(effects))
        return op_id


class CutLink:
    """Wraps a live simulated peer: every message it sends from ``start`` until ``end``
    (virtual seconds) is lost, as through a cut cable; attach one to each side of a cut.
    ``to``: only its sends to these peers are lost (a partition: one side's link each)."""

    def __init__(self, net: SimNetwork, inner: Any, start: float, end: float,
                 to: frozenset[str] | None = None) -> None:
        self.net, self.inner, self.start, self.end, self.to = net, inner, start, end, to

    def _cut(self, effects: Effects) -> Effects:
        if self.start <= self.net.clock.now() < self.end:
            effects.sends = [] if self.to is None else \
                [s for s in effects.sends if s.address not in self.to]
        return effects

    def receive(self, sender: str, message: Any, now: float, frames: Any = ()) -> Effects:
        return self._cut(self.inner.receive(sender, message, now, frames))

    def on_timer(self, kind: Any, token: int, now: float) -> Effects:
        return self._cut(self.inner.on_timer(kind, token, now))

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
    behind the values ahead of them too, as on one TCP connection.

    Attach it with ``net.attach(address, PacedLink(net, address, inner, rate))``."""

    def __init__(self, net: SimNetwork, address: str, inner: Any, rate: float,
                 serial: bool = False, queue_all: bool = False) -> None:
        self.net, self.address, self.inner = net, address, inner
        self.rate, self.serial, self.queue_all = rate, serial or queue_all, queue_all
        self.busy_until = 0.0

    def _paced(self, effects: Effects) -> Effects:
        now_sends = []
        for send in effects.sends:
            value = getattr(send.message, "value", None)
            if value is None and not (self.queue_all and self.busy_until > self.net.clock.now()):
                now_sends.append(send)
                continue
            now = self.net.clock.now()
            nbytes = value.nbytes if value is not None else 0
            done = (max(self.busy_until, now) if self.serial else now) + nbytes / self.rate
            if self.serial:
                self.busy_until = done
            self.net.clock.call_later(done - now, lambda s=send: self.net.apply(
                self.address, Effects(sends=[s])))
        effects.sends = now_sends
        return effects

    def receive(self, sender: str, message: Any, now: float, frames: Any = ()) -> Effects:
        return self._paced(self.inner.receive(sender, message, now, frames))

    def on_timer(self, kind: Any, token: int, now: float) -> Effects:
        return self._paced(self.inner.on_timer(kind, token, now))

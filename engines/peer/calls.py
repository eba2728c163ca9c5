"""A peer runner's calls to the owners of keys: each key's owner looked up once and cached
(``None``: this peer owns it, and serves the call itself), a call retried when its owner
had moved, died or did not hold the key yet, and the node operations awaiting their ``Done``.
``PeerRunner`` (``runner.py``) is one of these; its steps are the rest.
"""
from __future__ import annotations

from enum import IntEnum
from typing import Any, Callable

from .context import JobSpec, Timer, stacked
from .kademlia.events import Done, Effects, SetTimer
from .kademlia.node import KademliaNode
from .kademlia.routing import Contact
from .methods import Method, Status
from .owner import KeyOwner
from .pipeline import MAX_BATCH, Pushes, pushed_items


class Phase(IntEnum):
    IDLE = 0
    WORKING = 1       # fetching, computing or pushing
    BARRIER = 2
    DONE = 3
    FAILED = 4


Then = Callable[[Done, float, Effects], None]


class OwnerCalls:
    """GET and PUSH to key owners for a runner (``_ask``), with their retries (``_retry``).

    The runner provides ``step`` (the step a call is of by default), ``phase`` and
    ``error`` (an owner's ERROR answer fails it), ``owner``, its own ``KeyOwner``, and
    ``_push`` and ``_finish`` (own updates pushed again, ``_repush``, go before its later
    pushes of their keys, and its end waits for them).
    """

    step: int
    phase: Phase
    error: tuple[str, str, str] | None
    owner: KeyOwner

    def __init__(self, spec: JobSpec, node: KademliaNode) -> None:
        self.spec = spec
        self.node = node
        self.owners: dict[str, Contact | None] = {}   # None: this peer owns the key
        self._ops: dict[int, Then] = {}
        self._retries: dict[int, Callable[[float, Effects], None]] = {}
        self._next_token = 0
        # the keys with own updates pushed again and not all answered (``_repush``): key ->
        # step -> update not sent yet, waiting for the batch out to be answered; our later
        # pushes of those keys wait in ``_held``
        self._backlog: dict[str, dict[int, Any]] = {}
        self._held: dict[str, list[Pushes]] = {}
        self._echo: dict[str, int] = {}     # key -> token of the last answer kept as our copy
        self._serving_here = False      # inside a push or get this peer serves itself

    def _push(self, name: str, pushes: Pushes, now: float, eff: Effects) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError

    def _start_op(self, started: tuple[int, Effects], then: Then, eff: Effects) -> None:
        op_id, more = started
        self._ops[op_id] = then
        eff.extend(more)

    def _retry(self, again: Callable[[float, Effects], None], status: Status, now: float,
               eff: Effects) -> None:
        if status == Status.MISSING:            # give the owner time to fetch or receive it
            self._next_token += 1
            token = self._next_token
            self._retries[token] = again
            eff.timers.append(SetTimer(self.spec.retry_s, Timer.RETRY, token))
        else:
            again(now, eff)                     # the owner moved or died: look it up again

    def _ask(self, name: str, method: Method, update: Any, now: float, eff: Effects,
             answer: Callable[[Status, int, Any, float, Effects], None],
             step: int | tuple[int, ...] | None = None) -> None:
        """Send ``method`` for ``name`` to its owner (looked up if unknown), or run it here;
        ``step``: the step it is of (default: this peer's; -1: none), or the steps of a
        batch whose updates ``update`` stacks. ``answer(status, clock, value, now,
        effects)`` gets the value as a ``Blob`` (OK: never None)."""
        step = self.step if step is None else step
        kid = self.owner.kid(name)
        cached = self.owners.get(name)
        if cached is not None and self.node.is_gone(cached.node_id, now):
            del self.owners[name]               # it left (or died): look the owner up again
        if name not in self.owners:
            def located(done: Done, when: float, e: Effects) -> None:
                # The lookup skips suspects, but a suspect owns its keys until it is evicted
                # (``KeyOwner.closest_known``), so it is asked: it answers or times out. Were
                # we to serve the key, our own check would answer NOT_OWNER at once, and the
                # retry's lookup, seeded with no suspect, end at once: a loop on this thread
                # that nothing could end (a loaded peer whose contacts all missed a reply
                # answered nothing more, not even STATUS).
                found = [c for c in (*done.contacts[:1], self.owner.closest_known(kid))
                         if c is not None]
                closest = min(found, key=lambda c: c.node_id ^ kid, default=None)
                mine = closest is None or self.node.node_id ^ kid < closest.node_id ^ kid
                self.owners[name] = None if mine else closest
                self._ask(name, method, update, when, e, answer, step)
            self._start_op(self.node.find_node(kid, now), located, eff)
            return
        owner = self.owners[name]
        if owner is None:
            def served(got: tuple[int, tuple[Any, ...], Any], when: float, e: Effects) -> None:
                status, args, value = got
                if status != Status.OK:
                    self.owners.pop(name, None)
                if status == Status.ERROR:
                    self.phase, self.error = Phase.FAILED, (str(args[0]), str(args[1]), "")
                    return
                serving, self._serving_here = self._serving_here, True
                try:
                    answer(Status(status), args[0] if args else 0, value, when, e)
                finally:
                    self._serving_here = serving

            me = Contact(self.node.node_id, self.node.address)
            items = pushed_items(step, update) if method == Method.PUSH else ()
            got = self.owner.serve(me, name, kid, method, items, now, eff, served)
            if got is not None:                 # else answered once the write is durable
                served(got, now, eff)
            return

        def replied(done: Done, when: float, e: Effects) -> None:
            reply = done.reply
            if reply is not None and reply.status == Status.OK and method == Method.PUSH \
                    and owner is not None and self.owner.fenced(owner, kid):
                # a stale owner's answer (we know a peer closer to the key): taken as
                # NOT_OWNER, as our node would refuse its STORE, which the owner's round may
                # have skipped (``KeyOwner._skip``); the push goes to the owner found now
                reply = None
            if reply is None or reply.status not in (Status.OK, Status.MISSING):
                self.owners.pop(name, None)     # dead, or not the owner: look it up again
            if reply is not None and reply.status == Status.ERROR:
                args = reply.args + ("", "")
                self.phase, self.error = Phase.FAILED, (str(args[0]), str(args[1]), "")
                return
            status = Status(reply.status) if reply is not None and reply.status in (
                1, 2, 3) and (reply.value is not None or reply.status != Status.OK) \
                else Status.NOT_OWNER       # (an OK without a value: garbage, ask again)
            clock = reply.args[0] if reply is not None and reply.args else 0
            answer(status, clock, reply.value if reply is not None else None, when, e)
            if reply is not None and len(reply.args) > 1 and type(reply.args[1]) is int:
                # the answer is our copy (the owner's only other holder): once we hold it,
                # our next pushes echo its token, which settles the owner's own updates
                held = self.node.storage.get(kid, when)
                if held is not None and held.writer == owner.node_id and held.clock == clock:
                    self._echo[name] = reply.args[1]

        echo = (self._echo.get(name, -1),) if method == Method.PUSH else ()
        args = (name, step, self.spec.run, *echo) if type(step) is int else \
            (name, step[0], self.spec.run, *echo, *step[1:])
        self._start_op(self.node.call(owner, method, kid, now, args=args, value=update),
                       replied, eff)

    def _repush(self, name: str, pushes: Pushes, now: float, eff: Effects) -> None:
        """Push own updates again that this peer, as ``name``'s owner, applied and answered
        at once but whose write did not reach the holders (``KeyOwner.repush``), with their
        steps: the owner applies those its copy lacks (its stamps). Each pusher's steps
        must reach an owner in order, or one would be taken for a repeat and dropped: so
        these go as batches, one at a time, and our later pushes of ``name`` wait for them
        (``_held``)."""
        sending = name in self._backlog         # then these go once the batch out is answered
        self._backlog.setdefault(name, {}).update(pushes)
        if not sending:
            self._repush_next(name, now, eff)

    def _repush_next(self, name: str, now: float, eff: Effects) -> None:
        backlog = self._backlog[name]
        batch = tuple(sorted(backlog.items())[:MAX_BATCH])
        for step, _ in batch:
            del backlog[step]

        def acked(status: Status, clock: int, value: Any, when: float, e: Effects) -> None:
            if status != Status.OK:
                self._retry(lambda t, ef: self._ask_push(name, batch, acked, t, ef),
                            status, when, e)
                return
            if self._backlog[name]:
                self._repush_next(name, when, e)
                return
            del self._backlog[name]
            for pushes in self._held.pop(name, []):     # our later pushes, in order
                self._push(name, pushes, when, e)
            self._finish()
        self._ask_push(name, batch, acked, now, eff)

    def _ask_push(self, name: str, pushes: Pushes,
                  acked: Callable[[Status, int, Any, float, Effects], None], now: float,
                  eff: Effects) -> None:
        """PUSH ``name``'s updates of one step or more ((step, update) pairs, in order)."""
        if len(pushes) == 1:
            self._ask(name, Method.PUSH, pushes[0][1], now, eff, acked, pushes[0][0])
        else:
            self._ask(name, Method.PUSH, stacked([u for _, u in pushes]), now, eff, acked,
                      tuple(s for s, _ in pushes))

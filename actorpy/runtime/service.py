"""Services with one handler per message kind, so engines write no ``if msg.kind ==`` chains.

A handler gets the decoded payload and an ``Envelope`` (who sent it, from which of its
services, the step; ``defer()`` to answer later). Its return value is the reply to a
request; an exception it raises is the reply's ERROR (RemoteError at the caller). A cast
has no reply: a value returned for one is dropped, an exception is logged.

Example (examples/counter_service.py runs it)::

    ADD, READ = 1, 2

    class Counter(Service):
        def __init__(self, ctx: ServiceContext, start: int) -> None:
            super().__init__(ctx)
            self.total = start

        @handles(ADD)
        def add(self, n: int, env: Envelope) -> int:
            self.total += n
            return self.total

        @handles(READ)
        def read(self, _: None, env: Envelope) -> int:
            return self.total

    ref = cluster.start_service(Counter, 100, name="counter")
    cluster.call(ref, ADD, 5, timeout_s=10)          # 105
"""
from __future__ import annotations

import logging
from typing import Any, Callable, ClassVar, TypeVar

from actorpy.errors import ActorpyError, ProtocolError
from actorpy.ids import NodeId
from actorpy.log import Throttle
from actorpy.runtime.context import ServiceRef
from actorpy.runtime.service_context import Reply, ServiceContext, ServiceDied
from actorpy.wire import message as wm

log = logging.getLogger(__name__)
#: failed casts, reported once per interval per (service class, kind, sender)
_FAILURES = Throttle()

__all__ = ["Service", "handles", "Envelope", "Reply", "ServiceContext", "ServiceDied"]

F = TypeVar("F", bound=Callable[..., Any])
_KINDS_ATTR = "_actorpy_handles"


def handles(kind: int, *more: int) -> Callable[[F], F]:
    """Mark a ``Service`` method as the handler of message ``kind`` (and ``more`` kinds).

    The method is called as ``method(payload, env)``; see the module docstring.
    """
    kinds = (int(kind), *(int(k) for k in more))

    def mark(fn: F) -> F:
        setattr(fn, _KINDS_ATTR, getattr(fn, _KINDS_ATTR, ()) + kinds)
        return fn
    return mark


class Envelope:
    """What came with a message, beside its payload."""

    __slots__ = ("message", "_ctx", "_reply")

    def __init__(self, message: wm.Message, ctx: ServiceContext) -> None:
        self.message = message
        self._ctx = ctx
        self._reply: Reply | None = None

    @property
    def sender(self) -> NodeId:
        """The node that sent it (authenticated)."""
        return NodeId(self.message.sender)

    @property
    def from_service(self) -> int:
        """The sending service's id on its node (0: the node itself, e.g. a driver)."""
        return self.message.from_service

    @property
    def sender_ref(self) -> ServiceRef:
        """Where to cast back to the sending service."""
        return ServiceRef(self.sender, self.message.from_service)

    @property
    def kind(self) -> int:
        return self.message.kind

    @property
    def step(self) -> int:
        return self.message.header.step

    @property
    def is_request(self) -> bool:
        """Whether the sender waits for a reply (else it is a cast)."""
        return bool(self.message.header.request_id)

    @property
    def deferred(self) -> bool:
        return self._reply is not None

    def defer(self) -> Reply:
        """Answer later: returns the ``Reply`` to ``send``/``fail`` from a later message or
        timer (e.g. a barrier that releases a worker when the others catch up). The
        handler's return value is then ignored.

        Raises:
            ProtocolError: the message is a cast (the sender's mistake).
        """
        if self._reply is None:
            self._reply = self._ctx.defer(self.message)
        return self._reply


class Service:
    """Base class of services with handlers per kind (``@handles``).

    Subclasses take the service's context first in ``__init__`` and pass it on
    (``super().__init__(ctx)``); it is then ``self.ctx``. Override ``on_unknown`` to treat
    kinds without a handler otherwise (default: a ProtocolError, the caller's ERROR).
    ``close()`` runs on the service's thread when it stops.

    ``quick_kinds`` (a class or instance attribute) names kinds whose handlers are quick and
    never wait (no blocking ``call``, no disk, no long computation): a message of such a kind
    that finds the service idle and its inbox empty is handled on the node's I/O thread at
    once, one thread hand-off less per request. Handling stays one message at a time, in
    order; a handler must still not rely on which thread runs it. ``aside_kinds`` are
    handled so only while the service's thread is stepped aside (``ctx.unlocked``): kinds
    whose handlers may take too long for the I/O thread in general (a large value to fold),
    but should not wait for a long ``work``.
    """

    _handlers: ClassVar[dict[int, str]] = {}
    quick_kinds: frozenset[int] = frozenset()
    aside_kinds: frozenset[int] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table = dict(cls._handlers)  # inherited handlers; a subclass may override them
        seen: dict[int, str] = {}
        for name, attr in vars(cls).items():
            for kind in getattr(attr, _KINDS_ATTR, ()):
                if kind in seen:
                    raise ActorpyError(f"{cls.__qualname__}: kind {kind} has two handlers, "
                                       f"{seen[kind]} and {name}")
                seen[kind] = table[kind] = name
        cls._handlers = table

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def handle(self, msg: wm.Message, ctx: ServiceContext) -> None:
        """Dispatch ``msg`` to its handler (called by the runtime on the service's thread)."""
        env = Envelope(msg, ctx)
        try:
            name = self._handlers.get(msg.kind)
            if name is None:
                result = self.on_unknown(msg, env)
            else:
                # (released: a large payload's frames are not held while the handler runs)
                result = getattr(self, name)(msg.payload(release=True), env)
            if env.deferred:
                if result is not None:
                    log.warning("%s.%s returned a value after defer(); it is dropped: answer "
                                "through the Reply", type(self).__qualname__, name)
            elif env.is_request:
                ctx.reply(msg, result)
        except Exception as exc:
            if env.deferred:
                reply = env.defer()
                if not reply.done:
                    reply.fail(exc)
                    return
            elif env.is_request:
                raise  # the runtime sends the ERROR (and copes if even that fails)
            if ctx.node.closed:   # its sends fail with NodeLost: the shutdown, not a failure
                log.debug("%s: kind %d from %s handled as its node closed",
                          type(self).__qualname__, msg.kind, msg.sender, exc_info=True)
                return
            # a member's casts of the wrong shape (a ProtocolError: one line) or a handler's
            # bug (a traceback): either way once per 10 s per sender and kind, not per cast
            key = (type(self).__qualname__, msg.kind, msg.sender)
            if isinstance(exc, ProtocolError):
                _FAILURES.log(log, key, "%s dropped a cast of kind %d from %s: %s",
                              type(self).__qualname__, msg.kind, msg.sender, exc)
            else:
                _FAILURES.log(log, key, "%s failed on kind %d from %s", type(self).__qualname__,
                              msg.kind, msg.sender, level=logging.ERROR, exc_info=True)

    def on_unknown(self, msg: wm.Message, env: Envelope) -> Any:
        """A message of a kind with no handler: raise ProtocolError (the caller's ERROR)."""
        raise ProtocolError(f"{type(self).__qualname__} has no handler for kind {msg.kind} "
                            f"(it handles {sorted(self._handlers)})")

"""A service's inbox (bounded, FIFO) and a node's service ids (16 bits, reused, remembered).

Both are plain objects with no sockets and no threads of their own, so they are tested
directly (tests/core/test_mailbox.py).
"""
from __future__ import annotations

import enum
import threading
import time
from collections import deque
from typing import Any, Callable

from actorpy.errors import ActorpyError

#: The header's service field is a u16 and 0 is the core runtime: ids run 1..65535.
MAX_SERVICE_ID = 2**16 - 1

#: the size a queued control item counts as (a message's is its bytes, >= 0); a timer's
#: firing is a control item whose order against messages does not matter
_CONTROL, _TIMER = -1, -2

#: Reasons kept for freed ids are cut to this length (65 535 of them stay small).
_REASON_CHARS = 300


class Offer(enum.Enum):
    """What ``Mailbox.offer`` did with a message."""

    ACCEPTED = "accepted"
    FULL = "full"        # over a high-water mark: the caller refuses the message
    CLOSED = "closed"    # the service is stopping or gone


class Mailbox:
    """Everything for one service, in arrival order: messages from the wire and control
    items (replies to its requests, timers, membership events).

    Messages from the wire count against two high-water marks, ``max_items`` and
    ``max_bytes``. ``offer`` never blocks: the I/O thread calls it, and an I/O thread that
    waited for one slow service would stall every other service, every reply and the
    heartbeats of its node. Over a mark it answers FULL and the caller refuses the message
    (a request gets an ERROR at once). A single message larger than ``max_bytes`` still
    gets in when the inbox holds no other message, so no message is refused forever.
    Control items are never refused while the box is open: their number is bounded by
    what the service itself asked for (its requests in flight, its timers, its
    subscriptions), and dropping one would break the service's own logic.

    A thread other than the service's may run one message itself (``claim`` ... ``release``:
    a quick handler on the I/O thread) while the box is empty and the service's thread is
    idle in ``get``; ``get`` then waits for the release. So messages are still handled one
    at a time and in order, whichever thread runs them. The service's thread may also step
    aside from the item it handles (``step_aside`` ... ``step_back``: work that touches none
    of the service's state, a P2P peer's user ``push``): the box may be claimed meanwhile,
    and ``step_back`` waits for the release.

    Args:
        max_items: messages from the wire the inbox may hold.
        max_bytes: their total size in bytes.
    """

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._queue: deque[tuple[Any, int]] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._messages = 0
        self._bytes = 0
        self._open = True
        self._accepting = True
        self._serving = False   # the service's thread handles an item it took with get()
        self._claimed = False   # another thread handles a message (claim ... release)
        self._aside = False     # the service's thread stepped aside from its item
        self._lent_at = 0.0     # ... and may be claimed from then on (time.monotonic())
        #: messages refused because the inbox was full (for stats and tests)
        self.refused = 0
        #: the most messages from the wire held at once
        self.peak_messages = 0

    def offer(self, message: Any, nbytes: int) -> Offer:
        """Queue a message from the wire unless the inbox is full or closed (never blocks)."""
        with self._cond:
            if not (self._open and self._accepting):
                return Offer.CLOSED
            if self._messages >= self.max_items or (
                    self._messages and self._bytes + nbytes > self.max_bytes):
                self.refused += 1
                return Offer.FULL
            self._queue.append((message, nbytes))
            self._messages += 1
            self._bytes += nbytes
            self.peak_messages = max(self.peak_messages, self._messages)
            self._cond.notify()
        return Offer.ACCEPTED

    def post(self, item: Any, timer: bool = False) -> bool:
        """Queue a control item; False once the box is closed. ``timer``: a timer's firing,
        which a claimant of a box stepped aside may leave for later (``claim_queued``)."""
        with self._cond:
            if not self._open:
                return False
            self._queue.append((item, _TIMER if timer else _CONTROL))
            self._cond.notify()
        return True

    def get(self, timeout_s: float | None = None) -> Any:
        """The next item, waiting for one (None if ``timeout_s`` passed without one). Called
        by the service's thread: it is done with the item it took before."""
        with self._cond:
            self._serving = False
            if not self._cond.wait_for(lambda: self._queue and not self._claimed, timeout_s):
                return None
            item, nbytes = self._queue.popleft()
            if nbytes >= 0:
                self._messages -= 1
                self._bytes -= nbytes
            self._serving = True
            return item

    def claim(self, aside_only: bool = False) -> bool:
        """Whether the caller may handle a message itself, now (never waits): the box is
        open and empty and the service's thread idle in ``get`` or stepped aside (only
        stepped aside with ``aside_only``). Call ``release`` after."""
        with self._cond:
            if (self._queue or self._serving or self._claimed
                    or not (self._open and self._accepting)
                    or (aside_only and not self._aside)
                    or (self._aside and time.monotonic() < self._lent_at)):
                return False
            self._claimed = True
            return True

    def claim_queued(self, takes: Callable[[Any], bool]) -> list[Any] | None:
        """While the service's thread is stepped aside, ``claim`` the box with items queued:
        when each is a message the caller ``takes`` or a timer's firing (no other control
        item), the messages are the caller's to run first, in order (returned), and the
        timers stay for the service's thread (a timer is due at its time or later); None
        when the box cannot be claimed so. Call ``release`` after."""
        with self._cond:
            if not (self._aside and self._queue) or self._claimed \
                    or not (self._open and self._accepting) \
                    or time.monotonic() < self._lent_at \
                    or not all(nbytes == _TIMER or (nbytes >= 0 and takes(item))
                               for item, nbytes in self._queue):
                return None
            taken = [item for item, nbytes in self._queue if nbytes >= 0]
            timers = [entry for entry in self._queue if entry[1] == _TIMER]
            self._queue.clear()
            self._queue.extend(timers)
            self._messages = self._bytes = 0
            self._claimed = True
            return taken

    def release(self) -> None:
        """End a ``claim``: the service's thread may take items again. It is woken only if
        an item came in meanwhile: with the box empty it would wake to find nothing (one
        thread wake-up, and a turn at the interpreter lock, per quick message)."""
        with self._cond:
            self._claimed = False
            if self._queue or self._aside:
                self._cond.notify()   # the service's thread: in ``get`` or ``step_back``

    def step_aside(self, after_s: float = 0.0) -> bool:
        """Called by the service's thread while it handles an item, before work that
        touches none of the service's state: from ``after_s`` seconds on until
        ``step_back``, another thread may ``claim`` the box as if the service were idle.
        False (and nothing changed) when the caller is not the service's thread handling an
        item (a claimant, say)."""
        with self._cond:
            if not self._serving or self._aside:
                return False
            self._serving, self._aside = False, True
            self._lent_at = time.monotonic() + after_s
            return True

    def lent_in(self) -> float | None:
        """Seconds until the box of a service stepped aside may be claimed (``step_aside``'s
        ``after_s``), when that is still to come; else None."""
        with self._cond:
            if self._aside:
                left = self._lent_at - time.monotonic()
                if left > 0:
                    return left
            return None

    def step_back(self) -> None:
        """End a ``step_aside``: wait until no other thread handles a message, then the
        service's thread holds its item again."""
        with self._cond:
            self._cond.wait_for(lambda: not self._claimed)
            self._serving, self._aside = True, False

    def refuse_messages(self) -> None:
        """From now on ``offer`` answers CLOSED (a stopping service); control items and what
        is already queued remain until ``close``."""
        with self._cond:
            self._accepting = False

    def close(self) -> list[Any]:
        """Refuse everything from now on; returns what was still queued, in order."""
        with self._cond:
            self._open = self._accepting = False
            left = [item for item, _ in self._queue]
            self._queue.clear()
            self._messages = self._bytes = 0
            return left

    @property
    def is_open(self) -> bool:
        return self._open

    def __len__(self) -> int:
        return len(self._queue)


class ServiceIds:
    """Service ids of one node: 1..``max_id``, at most ``max_id`` in use at once.

    Fresh ids are handed out first; once all have been used, the id freed longest ago is
    reused. A message late for a stopped service is thus very unlikely to reach the next
    service with its id, and each freed id keeps the reason its service went (until it is
    reused) so a message for it gets an ERROR naming the service rather than silence.

    >>> ids = ServiceIds(max_id=2)
    >>> a, b = ids.allocate(), ids.allocate()
    >>> ids.release(a, "service 'x' (id 1) was stopped"); ids.reason(a)
    "service 'x' (id 1) was stopped"
    >>> ids.allocate(), ids.reason(a)
    (1, None)
    """

    def __init__(self, max_id: int = MAX_SERVICE_ID) -> None:
        if not 1 <= max_id <= MAX_SERVICE_ID:
            raise ValueError(f"max_id must be in 1..{MAX_SERVICE_ID}")
        self.max_id = max_id
        self._next = 1
        self._free: deque[int] = deque()
        self._reasons: dict[int, str] = {}
        self._in_use: set[int] = set()
        self._lock = threading.Lock()

    def allocate(self) -> int:
        """A free id.

        Raises:
            ActorpyError: ``max_id`` services are running on this node already.
        """
        with self._lock:
            if self._next <= self.max_id:
                sid = self._next
                self._next += 1
            elif self._free:
                sid = self._free.popleft()
                self._reasons.pop(sid, None)
            else:
                raise ActorpyError(
                    f"this node already runs {self.max_id} services, the most one node can "
                    "(the wire header's service id has 16 bits): stop services that are no "
                    "longer needed, or start new ones on other nodes")
            self._in_use.add(sid)
            return sid

    def release(self, sid: int, reason: str = "") -> None:
        """Free ``sid``; ``reason`` (why its service went) is kept until the id is reused."""
        with self._lock:
            if sid not in self._in_use:
                return
            self._in_use.discard(sid)
            self._free.append(sid)
            if reason:
                self._reasons[sid] = reason[:_REASON_CHARS]

    def reason(self, sid: int) -> str | None:
        """Why the service that last had ``sid`` went, if it is gone and the id not reused."""
        with self._lock:
            return self._reasons.get(sid)

    def in_use(self) -> int:
        with self._lock:
            return len(self._in_use)

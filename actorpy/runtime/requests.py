"""The request/reply table: requests waiting for their reply, by request id, indexed by
destination (a dead node's requests fail in time proportional to their number) and by
deadline (a request is failed and dropped at its deadline even when nobody waits on it).

Every entry leaves the table by exactly one of: its reply, its deadline, its node's death,
``discard`` (the caller gave up) or ``fail_all`` (the node closes). So the table holds only
requests that can still be answered.
"""
from __future__ import annotations

import heapq
import itertools
import threading
from typing import Callable

from actorpy.errors import ActorpyTimeout
from actorpy.ids import NodeId
from actorpy.runtime.reply import ReplyFuture


class RequestTable:
    """Thread-safe table of pending requests (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, ReplyFuture] = {}
        self._by_dest: dict[NodeId, set[int]] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._ids = itertools.count(1)

    def add(self, fut: ReplyFuture, deadline: float | None = None) -> int:
        """Register ``fut`` (waiting on ``fut.dest``); returns its new request id."""
        with self._lock:
            rid = next(self._ids)
            fut.request_id = rid
            self._pending[rid] = fut
            self._by_dest.setdefault(fut.dest, set()).add(rid)
            if deadline is not None:
                heapq.heappush(self._deadlines, (deadline, rid))
                if len(self._deadlines) > 2 * len(self._pending) + 1024:
                    # Answered requests leave their deadline behind; sweep them now and
                    # then so the heap stays proportional to what is really pending.
                    self._deadlines = [d for d in self._deadlines if d[1] in self._pending]
                    heapq.heapify(self._deadlines)
        return rid

    def take(self, rid: int, sender: str) -> tuple[ReplyFuture | None, bool]:
        """The future waiting for reply ``rid``, removed when ``sender`` is the node asked.

        Returns ``(None, False)`` for a late or unknown reply and ``(fut, False)`` (left in
        place) when someone else answered."""
        with self._lock:
            fut = self._pending.get(rid)
            if fut is None:
                return None, False
            if fut.dest != sender:
                return fut, False
            self._pop(rid)
            return fut, True

    def discard(self, fut: ReplyFuture) -> None:
        """Stop waiting for ``fut``'s reply (a late one is then dropped)."""
        with self._lock:
            if self._pending.get(fut.request_id) is fut:
                self._pop(fut.request_id)

    def fail(self, fut: ReplyFuture, exc: BaseException) -> None:
        """Remove ``fut`` and fail it with ``exc`` (if it is still pending)."""
        with self._lock:
            if self._pending.get(fut.request_id) is not fut:
                return
            self._pop(fut.request_id)
        _set_exception(fut, exc)

    def fail_dest(self, dest: NodeId, error: Callable[[ReplyFuture], BaseException]) -> int:
        """Fail every request waiting on ``dest`` with ``error(fut)``; returns how many."""
        with self._lock:
            futures = [self._pop(rid) for rid in list(self._by_dest.get(dest, ()))]
        for fut in futures:
            _set_exception(fut, error(fut))
        return len(futures)

    def fail_all(self, error: Callable[[ReplyFuture], BaseException]) -> None:
        with self._lock:
            futures = list(self._pending.values())
            self._pending.clear()
            self._by_dest.clear()
            self._deadlines.clear()
        for fut in futures:
            _set_exception(fut, error(fut))

    def expire(self, now: float) -> float | None:
        """Fail the requests whose deadline has passed; returns the next deadline or None."""
        expired: list[ReplyFuture] = []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                _, rid = heapq.heappop(self._deadlines)
                if rid in self._pending:
                    expired.append(self._pop(rid))
            following = self._deadlines[0][0] if self._deadlines else None
        for fut in expired:
            _set_exception(fut, ActorpyTimeout(
                f"{fut.what} on {fut.dest} got no reply within {fut.timeout_s} s; raise the "
                "timeout, or check that node's log"))
        return following

    def next_deadline(self) -> float | None:
        with self._lock:
            return self._deadlines[0][0] if self._deadlines else None

    def __len__(self) -> int:
        return len(self._pending)

    def _pop(self, rid: int) -> ReplyFuture:
        fut = self._pending.pop(rid)
        rids = self._by_dest.get(fut.dest)
        if rids is not None:
            rids.discard(rid)
            if not rids:
                del self._by_dest[fut.dest]
        return fut


def _set_exception(fut: ReplyFuture, exc: BaseException) -> None:
    if not fut.done():
        try:
            fut.set_exception(exc)
        except Exception:  # InvalidStateError: resolved by another thread meanwhile
            pass

"""The iterative node lookup as a pure state machine (paper section 2.3).

The lookup keeps a shortlist sorted by XOR distance to the target. It asks for at most
``alpha`` queries at a time, always to the closest not-yet-queried contacts among the ``ksize``
closest live ones, and ends when those ``ksize`` closest have all answered (so the last round
found nothing closer), when a value is found, or when no candidate is left. It does no I/O and
knows no time: the node sends the queries it hands out, and reports answers and failures.

>>> from .routing import Contact
>>> lk = Lookup(KadId(0), [Contact(KadId(8), "a"), Contact(KadId(4), "b")], ksize=2, alpha=1)
>>> [c.address for c in lk.next_queries()]
['b']
>>> lk.on_nodes(KadId(4), [Contact(KadId(1), "c")])
>>> [c.address for c in lk.next_queries()]
['c']
>>> lk.on_nodes(KadId(1), []); lk.next_queries(), lk.is_done
([], True)
>>> [c.address for c in lk.result()], lk.rounds
(['c', 'b'], 2)
"""
from __future__ import annotations

import bisect
from typing import Any, Iterable

from .ids import KadId
from .routing import Contact

FRESH, IN_FLIGHT, ANSWERED, FAILED = range(4)


class Lookup:
    """Find the ``ksize`` contacts closest to ``target`` (or a value stored under it).

    Args:
        target: the id looked up.
        seeds: the starting shortlist (the caller's own closest contacts).
        ksize: how many closest contacts the lookup must have heard from (*k*).
        alpha: the most queries in flight at once (paper: 3).
        own_id: the caller's id, never put on the shortlist.
        stop_at_value: end at the first value (the paper's FIND_VALUE); False asks the k
            closest all the same and keeps every value in ``values`` (to pick the newest).
    """

    def __init__(self, target: KadId, seeds: Iterable[Contact], *, ksize: int, alpha: int,
                 own_id: KadId | None = None, stop_at_value: bool = True) -> None:
        self.target = target
        self.ksize = ksize
        self.alpha = alpha
        self.own_id = own_id
        self._order: list[tuple[int, int]] = []          # (distance, id), sorted
        self._contacts: dict[int, Contact] = {}
        self._state: dict[int, int] = {}
        self._round: dict[int, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.queries = 0
        self.rounds = 0
        self.value: Any = None               # what on_value was given (the node: a Value)
        self.value_from: Contact | None = None
        self.values: list[Any] = []
        self.stop_at_value = stop_at_value
        self.seeded_empty = True
        self._top_cache: list[int] | None = None
        for contact in seeds:
            self._add(contact, 1)
        self.seeded_empty = not self._contacts

    def _add(self, contact: Contact, round_no: int) -> None:
        node_id = contact.node_id
        if node_id == self.own_id:
            return
        if node_id in self._contacts:
            self._round[node_id] = min(self._round[node_id], round_no)
            return
        self._contacts[node_id] = contact
        self._state[node_id] = FRESH
        self._round[node_id] = round_no
        bisect.insort(self._order, (node_id ^ self.target, node_id))
        self._top_cache = None

    def _top(self) -> list[int]:
        """Ids of the ``ksize`` closest candidates not known to have failed."""
        if self._top_cache is not None:
            return self._top_cache
        top: list[int] = []
        for _, node_id in self._order:
            if self._state[node_id] != FAILED:
                top.append(node_id)
                if len(top) == self.ksize:
                    break
        self._top_cache = top
        return top

    def next_queries(self) -> list[Contact]:
        """Contacts to query now (each marked in flight); empty when nothing more is due."""
        if self.is_done:
            return []
        out: list[Contact] = []
        for node_id in self._top():
            if self.in_flight >= self.alpha:
                break
            if self._state[node_id] == FRESH:
                self._state[node_id] = IN_FLIGHT
                self.in_flight += 1
                self.queries += 1
                self.rounds = max(self.rounds, self._round[node_id])
                out.append(self._contacts[node_id])
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return out

    def _settle(self, node_id: int, state: int) -> bool:
        if self._state.get(node_id) != IN_FLIGHT:
            return False
        self._state[node_id] = state
        self.in_flight -= 1
        if state == FAILED:
            self._top_cache = None
        return True

    def on_nodes(self, from_id: KadId, contacts: Iterable[Contact]) -> None:
        """``from_id`` answered with these contacts (already filtered of known-dead ones)."""
        if self._settle(from_id, ANSWERED):
            next_round = self._round[from_id] + 1
            for contact in contacts:
                self._add(contact, next_round)

    def on_value(self, from_id: KadId, value: Any) -> None:
        """``from_id`` answered a FIND_VALUE with the value: the lookup is over (unless it
        does not stop at values)."""
        if self._settle(from_id, ANSWERED):
            self.values.append(value)
            if self.stop_at_value:
                self.value = value
                self.value_from = self._contacts[from_id]

    def on_failure(self, from_id: KadId) -> None:
        """``from_id`` timed out or sent a bad reply: skip it from now on."""
        self._settle(from_id, FAILED)

    def revive(self, from_id: KadId) -> bool:
        """``from_id``, given up on (``on_failure``), answered after all: in flight again,
        so that its answer (``on_nodes`` / ``on_value``) counts; False if it was not failed."""
        if self._state.get(from_id) != FAILED:
            return False
        self._state[from_id] = IN_FLIGHT
        self.in_flight += 1
        self._top_cache = None
        return True

    @property
    def is_done(self) -> bool:
        """True once a value was found or the ``ksize`` closest live candidates all answered."""
        if self.value is not None:
            return True
        return all(self._state[i] == ANSWERED for i in self._top())

    def result(self) -> list[Contact]:
        """The closest contacts that answered, closest first (at most ``ksize``)."""
        out = [self._contacts[i] for _, i in self._order if self._state[i] == ANSWERED]
        return out[:self.ksize]

    def is_pending(self, node_id: int) -> bool:
        """Whether a query to ``node_id`` is in flight."""
        return self._state.get(node_id) == IN_FLIGHT

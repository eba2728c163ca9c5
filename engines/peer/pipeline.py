"""A peer's pushes in flight and waiting (``Job(overlap=n)``, ``barrier.pipeline_depth``).

One batch is out at most. The updates of the steps computed while it travels wait, and
go together once all of it was answered: each key's as one push, in step order. So an
owner folds each peer's steps in order, each once, however deep the pipeline. A step that
would leave more than ``depth`` steps' updates unanswered is done only once they go
(``full``). Deeper than one step, a step reads the values with the peer's own updates not
answered yet folded in (``pending``, ``context.read_own``), so it misses only the others'
updates meanwhile. Pure bookkeeping: the runner sends and counts the steps.
"""
from __future__ import annotations

from typing import Any

from .kademlia.rpc import MAX_ARGS

Pushes = tuple[tuple[int, Any], ...]   # (step, update) pairs of one key, in step order

#: the most steps one PUSH may carry (a pipelined pusher's batch, ``runner``: its args
#: are the key, the first step, the run, a token and the other steps, of ``rpc.MAX_ARGS``)
MAX_BATCH = MAX_ARGS - 3


def pushed_items(steps: Any, update: Any) -> tuple[tuple[int, Any], ...]:
    """A PUSH's (step, update) pairs: one for a step (an int; anything else but a tuple is
    none, -1), or one per step of a batch: increasing steps >= 0 (2 .. ``MAX_BATCH``), the
    updates stacked along a first axis of that length. () when a batch is malformed.

    >>> import numpy as np
    >>> [(s, u.tolist()) for s, u in pushed_items((4, 6), np.array([[1, 2], [3, 4]]))]
    [(4, [1, 2]), (6, [3, 4])]
    >>> pushed_items((6, 4), np.zeros((2, 2))), pushed_items((4, 6), np.zeros(3))
    ((), ())
    """
    if type(steps) is not tuple:
        return ((steps if type(steps) is int else -1, update),)
    shape = getattr(update, "shape", None)
    if not 2 <= len(steps) <= MAX_BATCH or any(type(s) is not int for s in steps) \
            or steps[0] < 0 or any(a >= b for a, b in zip(steps, steps[1:])) \
            or not shape or shape[0] != len(steps):
        return ()
    return tuple((s, update[i]) for i, s in enumerate(steps))


class Pipeline:
    """The batch out and the steps waiting.

    Args:
        depth: steps whose updates may be unanswered when the next one begins (0: the
            runner waits for every answer and does not use this).
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.waiting: list[tuple[int, dict[str, Any]]] = []
        self.full = False
        self._flight = 0                        # the steps of the batch out
        self._out: dict[str, Pushes] = {}       # its keys not answered yet, their updates

    @property
    def travelling(self) -> bool:
        """Whether some key of the batch out is not answered yet."""
        return bool(self._out)

    @property
    def busy(self) -> bool:
        """Whether some update is out or waiting."""
        return bool(self.travelling or self.waiting)

    @property
    def unanswered(self) -> int:
        """Steps done whose updates are out or waiting (a full step is not done yet)."""
        return (self._flight if self.travelling else 0) + len(self.waiting) - self.full

    def queue(self, step: int, updates: dict[str, Any], stacks: bool) -> bool:
        """Queue a computed step's updates; whether the step may count as done now. With
        updates that do not stack (bytes) a batch holds one step at most."""
        self.waiting.append((step, updates))
        lag = (self._flight if self.travelling else 0) + len(self.waiting)
        self.full = lag > (self.depth if stacks else 1)
        return not self.full

    def take(self) -> dict[str, Pushes]:
        """The waiting steps' updates, each key's in step order; they travel from now."""
        steps, self.waiting = self.waiting, []
        items: dict[str, list[tuple[int, Any]]] = {}
        for step, updates in steps:
            for name, update in updates.items():
                items.setdefault(name, []).append((step, update))
        self._flight = len(steps)
        self._out = {name: tuple(pushes) for name, pushes in items.items()}
        return dict(self._out)

    def pending(self) -> list[tuple[int, str, Any]]:
        """The updates not answered yet, (step, key, update) in step order: those of the
        batch out whose keys were not answered, then the waiting steps'."""
        out = sorted(((step, name, update) for name, pushes in self._out.items()
                      for step, update in pushes), key=lambda item: item[:2])
        return out + [(step, name, update) for step, updates in self.waiting
                      for name, update in updates.items()]

    def release(self) -> bool:
        """Whether a full step waited for the batch just taken to go: it may count as done
        now (and the pipeline is no longer full)."""
        held, self.full = self.full, False
        return held

    def landed(self, name: str) -> bool:
        """``name``'s push of the batch out was answered; whether all of it was."""
        self._out.pop(name, None)
        return not self._out

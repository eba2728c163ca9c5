"""The P2P engine's CALL methods and how an owner answers them (``owner.py`` serves them,
``calls.py`` asks)."""
from __future__ import annotations

from enum import IntEnum


class Method(IntEnum):
    """The P2P engine's CALL methods (this engine's own enum)."""

    GET = 1      # args (key,) -> OK (clock,) + value
    PUSH = 2     # args (key, step, run, token) + update -> OK (clock,) + the new value, or
                 # OK (clock, token) when the answer is the pusher's copy (it echoes the
                 # token in its next pushes: it holds that copy; -1: none); a batch of a
                 # pipelined pusher's steps: args (key, step, run, token, step, ...) + the
                 # updates stacked


class Status(IntEnum):
    """How an owner answers."""

    OK = 1
    NOT_OWNER = 2     # someone is closer to the key: look the owner up again
    MISSING = 3       # the owner does not hold the key (yet): retry after ``retry_s``
    ERROR = 4         # pull raised: args (type, message)

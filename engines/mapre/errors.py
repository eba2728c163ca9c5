"""What the map-reduce engine raises on purpose (all ActorpyErrors, each saying what to do)."""
from __future__ import annotations

import math
import numbers
from typing import Any

from actorpy.errors import ActorpyError


class MapreError(ActorpyError):
    """Base of the map-reduce engine's errors."""


class ArgumentError(MapreError, TypeError):
    """A transformation or action got an argument of the wrong kind (e.g. not a function)."""


def check_timeout(timeout_s: Any, what: str) -> float:
    """``timeout_s`` of an action, ``broadcast`` or ``unpersist``: a finite number of
    seconds > 0. NaN never timed out, a negative or zero one failed at once as a timeout
    ("did not finish within -1 s": not the caller's mistake it is), and an infinite one
    waited for ever on a hung task."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) \
            or not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ArgumentError(f"{what}: timeout_s must be a number of seconds, finite and > 0, "
                            f"got {timeout_s!r}")
    return float(timeout_s)


class InputNotFound(MapreError, FileNotFoundError):
    """``load`` was given a path, directory or glob that names no readable file."""


class InputDecodeError(MapreError, ValueError):
    """A line of the input is not valid UTF-8.

    Attributes:
        path: the file.
        offset: the byte offset of the first undecodable byte in that file.
    """

    def __init__(self, path: str, offset: int, detail: str) -> None:
        super().__init__(f"{path}: byte offset {offset} is not valid UTF-8 ({detail}); fix the "
                         "file, or pass errors='replace' to mapre.load() to read it with "
                         "replacement characters")
        self.path = path
        self.offset = offset

    def __reduce__(self):  # keep the fields when it travels back from a worker
        return (_rebuild_decode_error, (self.path, self.offset, str(self)))


def _rebuild_decode_error(path: str, offset: int, message: str) -> InputDecodeError:
    err = InputDecodeError.__new__(InputDecodeError)
    MapreError.__init__(err, message)
    err.path, err.offset = path, offset
    return err


class InputNotWords(MapreError, ValueError):
    """With ``cut_long_lines``, a stretch of input too long to hold in memory has no
    whitespace to cut it at: not text made of words (a sparse file, a disk image)."""


class InputChanged(MapreError, ValueError):
    """An input file is shorter than when the job listed it: it was truncated or rewritten
    while the job ran, so the lines past its new end would be missing from the result."""


class OutputExists(MapreError, FileExistsError):
    """``save`` was pointed at a directory that already holds files."""


class EmptyDatasetError(MapreError, ValueError):
    """``reduce`` of a dataset with no items (use ``fold`` with a zero instead)."""


class FetchFailed(MapreError):
    """A task could not fetch an input block: its holder died or lost it. The scheduler
    recomputes the block from lineage and runs the task again; users see this only when
    that keeps failing.

    Attributes:
        node: the worker that held the block.
        key: the block's key.
    """

    def __init__(self, node: str, key: str, reason: str) -> None:
        super().__init__(f"could not fetch {key!r} from {node}: {reason}")
        self.node = node
        self.key = key
        self.reason = reason

    def __reduce__(self):
        return (FetchFailed, (self.node, self.key, self.reason))


class JobFailed(MapreError):
    """A job could not finish for a reason that is not a user function's exception (a
    partition failed too many times, or no workers are left)."""

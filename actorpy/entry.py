"""The ``actorpy`` command's entry point. It imports the command line inside a handler: a
Ctrl-C while that loads (about 0.15 s of imports) exits with status 130, as one later does,
instead of a ``KeyboardInterrupt`` traceback."""
from __future__ import annotations

from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from actorpy.cli import main as run
    except KeyboardInterrupt:
        return 130
    return run(argv)

"""Complete programs built on the engines; each module has ``main(argv=None) -> int``.

``python -m apps.NAME`` runs as ``actorpy NAME`` does (``run_as_command``)."""
from __future__ import annotations

import sys


def run_as_command(command: str) -> int:
    """``python -m apps.<module>``: run it as ``actorpy <command>``, with the same error lines
    ("actorpy sgd: ...", no traceback), exit statuses and closed-stream handling. The CLI
    imports the module by its own name: run as ``__main__`` its classes (a parameter
    server's callbacks) would be pickled by value for the workers, and some cannot be."""
    from actorpy.cli import main

    return main([command, *sys.argv[1:]])

"""What every app shares, so they all behave alike: the cluster flags, connecting from them,
and ``--json`` output that keeps stdout clean.

Every app accepts ``--workers N`` (embedded cluster), ``--manager tcp://HOST:PORT`` with
``--secret-file F`` (an existing cluster) and ``--json`` (stdout holds only the JSON)::

    parser = argparse.ArgumentParser(prog="actorpy wordcount")
    apputil.add_cluster_arguments(parser)
    args = parser.parse_args(argv)
    with apputil.connect_from_args(args) as cluster:
        ...
    apputil.print_json(result)
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
from typing import Any, TextIO

from actorpy.errors import ActorpyError, ConfigError, RemoteError


def add_cluster_arguments(parser: argparse.ArgumentParser, *, default_workers: int = 2,
                          json_flag: bool = True) -> None:
    """Add ``--workers``, ``--manager``, ``--secret-file`` (and ``--json``) to ``parser``."""
    group = parser.add_argument_group("cluster")
    group.add_argument("--workers", type=int, default=None,
                       help=f"worker processes of the embedded local cluster "
                            f"(default {default_workers}); ignored with --manager")
    group.add_argument("--manager", metavar="tcp://HOST:PORT", type=given("an address"),
                       help="run on an existing cluster instead of an embedded one")
    group.add_argument("--secret-file", metavar="F", type=given("a file name"),
                       help="the cluster secret, with --manager (else ACTORPY_SECRET)")
    parser.set_defaults(default_workers=default_workers)
    if json_flag:
        parser.add_argument("--json", action="store_true",
                            help="print only a JSON object on stdout")


def given(what: str) -> Any:
    """argparse ``type=`` for a flag's value that may not be empty or blank: ``--manager
    "$UNSET"`` ran the job on an embedded cluster, on this machine, without a word.

    >>> given("an address")("tcp://h:7400")
    'tcp://h:7400'
    """
    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"needs {what}, got an empty one (an unset "
                                             "variable?); leave the flag out if not meant")
        return text
    return check


def connect_from_args(args: argparse.Namespace, **settings: Any) -> Any:
    """``actorpy.connect`` as the cluster flags say: an existing cluster with ``--manager``,
    else an embedded one with ``--workers`` processes.

    Raises:
        ConfigError: bad flags (workers < 1, --secret-file without --manager).
    """
    from actorpy.runtime.cluster import connect

    if args.manager:
        return connect(args.manager, secret_file=args.secret_file, **settings)
    if args.secret_file:
        raise ConfigError("--secret-file goes with --manager")
    workers = args.workers if args.workers is not None else args.default_workers
    if workers < 1:
        raise ConfigError("--workers must be at least 1")
    return connect(workers=workers, **settings)


def summary(doc: str | None) -> str:
    """An app's ``--help`` description from its module docstring: the first paragraph,
    without the leading "``actorpy NAME``: ", as one sentence, its ``literals`` plain.

    >>> summary("``actorpy sgd``: regression by SGD, on\\ngenerated data.\\n\\n    actorpy sgd")
    'Regression by SGD, on generated data.'
    >>> summary("``actorpy dnn``: digits or, with ``--data DIR``, MNIST.")
    'Digits or, with --data DIR, MNIST.'
    """
    first = " ".join((doc or "").strip().split("\n\n")[0].split())
    first = re.sub(r"^``actorpy [\w-]+``: ", "", first)
    first = first.replace("``", "")
    return first[:1].upper() + first[1:]


def print_json(value: Any, out: TextIO | None = None) -> None:
    """Write ``value`` as one JSON document on stdout (the only thing there with --json).

    A float that is not finite (a diverged loss) is written as ``null``: ``NaN`` and
    ``Infinity`` are not JSON, and strict parsers (``jq``, browsers) refuse them."""
    out = sys.stdout if out is None else out
    # dumps, not dump: dump writes each small piece separately (seconds for a big object).
    # Non-finite floats are rare: look for them (a walk in Python, as long as the encoding
    # in C for a big dict of counts) only when the encoder has met one.
    try:
        text = _dumps(value)
    except ValueError:
        value = _finite(value)
        text = _dumps(value)
    try:
        out.write(text)
    except UnicodeEncodeError:
        # a stream that cannot encode every character (stdout in an ASCII or cp1252
        # locale): the same JSON with \u escapes, which any encoding writes
        out.write(json.dumps(value, allow_nan=False))
    out.write("\n")
    out.flush()


def _dumps(value: Any) -> str:
    """``value`` as JSON text, non-ASCII characters written as they are (not ``\\uXXXX``).

    The ASCII encoder is tried first: about 30 % faster in C (0.10 against 0.14 s for 400k
    word counts), and its text is the same when it escaped nothing as ``\\u``."""
    text = json.dumps(value, allow_nan=False)
    if "\\u" in text:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    return text


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float in dicts, lists and tuples replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def positive_float(text: str) -> float:
    """argparse ``type=`` for a finite number > 0 (a learning rate, a decay)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """argparse ``type=`` for a whole number >= 0 (a staleness, a sample size)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def embedded_workers(args: argparse.Namespace) -> int:
    """Worker processes an embedded cluster of these flags runs here; 0 with ``--manager``
    (its workers run elsewhere)."""
    if args.manager:
        return 0
    return args.workers if args.workers is not None else args.default_workers


def error_line(exc: ActorpyError) -> str:
    """An error as a command-line user wants it: a remote failure without its remote
    traceback, unless logging is at DEBUG (where the traceback helps); the command line's
    own wording where the error has one (``cli_message``)."""
    if exc.cli_message is not None:
        return exc.cli_message
    if isinstance(exc, RemoteError) and not logging.getLogger().isEnabledFor(logging.DEBUG):
        # actorpy's own errors are worded for the user: their class path adds nothing
        own = exc.remote_type.startswith("actorpy.errors.")
        what = exc.remote_message if own else f"{exc.remote_type}: {exc.remote_message}"
        return (f"{what} (on node {exc.node_id}; --log-level DEBUG shows the remote "
                "traceback)")
    return str(exc)

"""Where datasets come from: text files (``load``) and the driver's own items (``from_items``)."""
from __future__ import annotations

import codecs
import numbers
import os
from typing import Any, Iterable, Sequence, TypeVar

from actorpy.errors import ConfigError
from engines.mapre import io
from engines.mapre import plan as P
from engines.mapre.dataset import MAX_PARTITIONS, Dataset, _check_partitions
from engines.mapre.engine import engine_for

T = TypeVar("T")


def load(cluster: Any, path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
         split_bytes: int = io.DEFAULT_SPLIT_BYTES, errors: str = "strict",
         lines: bool = True, cut_long_lines: bool = False) -> Dataset[Any]:
    """Lines of text files: one item per line, ``\\n`` / ``\\r\\n`` stripped, UTF-8.

    Each file is cut into even byte ranges of at most ``split_bytes`` on line boundaries,
    one partition each, but for small files: consecutive ones share a partition of at most
    ``split_bytes`` (and of at most an even share of the input per worker, so that each
    worker gets one). Every worker reads its own ranges, so no process ever holds a whole
    file. Paths must be readable at the same path on every worker; relative ones are taken
    from the driver's directory. A byte order mark at the start of a file is dropped.

    Args:
        cluster: from ``actorpy.connect()``.
        path: a file, a directory (its files, skipping ``_*`` and ``.*``), a glob (one with
            ``*?[`` is a glob, as in the shell, where a file has that very name too), or a list.
        split_bytes: at most this many bytes per partition (default 32 MiB).
        errors: "strict" (an undecodable byte fails naming file and offset), "replace", ...
        lines: False gives blocks of text instead: each a str of whole lines (about 64 KB,
            line ends kept, every one ending with a newline but perhaps the file's last),
            for code that splits text in C itself: counting the words of
            ``block.split()`` runs one C call per block where lines need a few per line.
        cut_long_lines: with ``lines=False``, a line longer than a block is cut after a
            whitespace character (never inside a word or a character), so that a block stays about
            64 KB however long the lines: a corpus of one line (text8: 100 MB) is read a
            block at a time instead of being held whole, several times over, by a worker.
            For code that splits blocks on whitespace; the blocks are then no longer lines.
            64 MiB with no whitespace fail the job with ``InputNotWords``.

    Raises:
        InputNotFound: a path is missing or a glob matches nothing (before any work runs).

    Example::

        lines = mapre.load(cluster, "logs/*.txt", split_bytes=64 << 20)
    """
    try:
        codecs.lookup_error(errors)
    except LookupError:
        raise ConfigError(f"errors={errors!r} is not a codec error handler; use 'strict' or "
                          "'replace'") from None
    if not isinstance(split_bytes, numbers.Integral) or isinstance(split_bytes, bool) \
            or split_bytes < 1:
        raise ConfigError(f"split_bytes must be an integer >= 1, got {split_bytes!r}")
    split_bytes = int(split_bytes)
    if cut_long_lines and lines:
        raise ConfigError("cut_long_lines=True needs lines=False: a line is an item whole")
    files = io.list_inputs(path)
    total = sum(os.path.getsize(f) for f in files)
    if -(-total // split_bytes) > MAX_PARTITIONS:
        # a partition holds at most split_bytes: split_bytes=1 made a task per byte (26k
        # for a 26 kB README, 9 s; a 1 GB file's billion splits exhausted the driver)
        raise ConfigError(f"split_bytes={split_bytes} cuts the {total:,} bytes of input into "
                          f"more than {MAX_PARTITIONS} partitions, each a task; give "
                          f"split_bytes >= {-(-total // MAX_PARTITIONS):,}")
    where = (os.fspath(path) if isinstance(path, (str, os.PathLike))
             else f"{len(files)} file{'s' * (len(files) != 1)}")
    engine = engine_for(cluster)
    parts = io.pack_splits(io.make_splits(files, split_bytes), split_bytes,
                           len(engine.workers()))
    node = P.TextSource(tuple(parts), errors, where, not lines, cut_long_lines)
    return Dataset(engine, node)


def from_items(cluster: Any, items: Iterable[T], partitions: int | None = None) -> Dataset[T]:
    """A dataset of the driver's items, cut into ``partitions`` contiguous pieces
    (default: one per worker). The items travel with the tasks that read them.

    Example::

        squares = mapre.from_items(cluster, range(1000), partitions=4).map(lambda x: x * x)
    """
    engine = engine_for(cluster)
    if partitions is None:
        partitions = max(1, len(engine.workers()))
    partitions = _check_partitions(partitions, "from_items")
    data = list(items)
    n = len(data)
    chunks = tuple(data[i * n // partitions:(i + 1) * n // partitions] for i in range(partitions))
    return Dataset(engine, P.ItemsSource(chunks))

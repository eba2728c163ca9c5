"""``actorpy wordcount``: count words in text files on a cluster (Actor's classic example).

Lines are split on whitespace (``str.split()``), lower-cased, Actor's stop words are dropped,
and the rest are counted. Each partition is counted with a C-level ``Counter`` and the driver
merges the partitions' counts as they come back (``reduce_by_key_locally``).

    actorpy wordcount --workers 2 --top 10 books/*.txt
    actorpy wordcount --json corpus/ > counts.json
    actorpy wordcount --manager tcp://10.0.0.5:7400 --secret-file ~/.actorpy/secret data/
"""
from __future__ import annotations

import argparse
import operator
import os
import sys
import tempfile
import time
import unicodedata
from collections import Counter
from itertools import chain
from typing import Any, Iterable, Iterator, Sequence

from actorpy import apputil
from actorpy.errors import ActorpyError, ActorpyTimeout, ConfigError
from engines import mapre

#: Splits no smaller than this (the default of ``mapre.load``) ...
MIN_SPLIT_BYTES = 32 << 20
#: ... and about this many per worker: few, as the driver merges one partial result per
#: partition (a dict of about the whole vocabulary, 0.1 s for 200k words), but more than
#: one, so that a worker slowed by other work hands some of its share to the other.
SPLITS_PER_WORKER = 2

#: The most characters of a word the table shows (``label``); --json has every word whole.
SHOWN_CHARS = 60

#: Actor's stop words (owlbarn/actor's wordcount example).
STOP_WORDS = frozenset("a are is in it that this and to of so will can which for on an "
                       "with the -".split())


def count_blocks(blocks: Iterator[str]) -> Iterable[tuple[str, int]]:
    """Word counts of one partition read as blocks of whole lines (``load(...,
    lines=False, cut_long_lines=True)``: a line longer than a block comes in pieces cut
    between words), stop words dropped: the same as ``count_partition`` of its lines.

    Each block is lower-cased and split in one C call each, and one ``Counter`` counts the
    words in C. Lower-casing a block is lower-casing its lines: a newline (or the space a
    long line is cut after) is not a cased letter, so the final-sigma rule reads the same
    neighbours. Keys are str, not undecoded bytes: a dict whose keys are all str looks them
    up on a faster path (counting bytes and decoding only the distinct words, tried before,
    took ~10 % more CPU).
    """
    counts = Counter(chain.from_iterable(map(str.split, map(str.lower, blocks))))
    for word in STOP_WORDS:
        counts.pop(word, None)
    return counts.items()


def count_partition(lines: Iterator[str]) -> Iterable[tuple[str, int]]:
    """Word counts of one partition, stop words dropped (one Counter, filled in C).

    Lower-casing a whole line before splitting it gives the same words as splitting first:
    no character changes between whitespace and non-whitespace when lower-cased.
    """
    counts = Counter(chain.from_iterable(map(str.split, map(str.lower, lines))))
    for word in STOP_WORDS:
        counts.pop(word, None)
    return counts.items()


def word_counts(cluster: Any, paths: Sequence[str], *, timeout_s: float = 3600.0,
                progress: bool | None = None, errors: str = "strict") -> dict[str, int]:
    """``{word: count}`` over every line of ``paths`` (files, directories or globs).

    Each partition's counts come back to the driver, which merges them while the other
    partitions are still being counted (the whole dict ends up here anyway, so a shuffle
    would only add a stage). A partition's counts hold about one entry per word of the
    vocabulary whatever its size, so the input is cut into few partitions:
    ``SPLITS_PER_WORKER`` per worker, none under ``MIN_SPLIT_BYTES`` (a 2 GB input on 2
    workers: 4 partitions of 500 MB, each read 4 MB at a time, rather than 64 of 32 MB, each
    merged on the driver; 8 files of 26 MB: 4 partitions of two files each).
    ``errors="replace"`` reads undecodable bytes as U+FFFD instead of failing on the first."""
    total = sum(os.path.getsize(f) for f in mapre.list_inputs(list(paths)))
    # 10% over the even share, so that files of about that share stay one partition each
    share = total * 11 // (10 * SPLITS_PER_WORKER * max(1, len(cluster.workers())))
    return (mapre.load(cluster, list(paths), lines=False, cut_long_lines=True, errors=errors,
                       split_bytes=max(MIN_SPLIT_BYTES, share))
            .map_partitions(count_blocks)
            .reduce_by_key_locally(operator.add, timeout_s=timeout_s, progress=progress))


def columns(word: str) -> int:
    """Terminal columns ``word`` takes: none for a combining mark, two for a wide (CJK,
    emoji) character, one for any other."""
    return sum(0 if unicodedata.combining(c) else
               2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in word)


def shown(word: str) -> str:
    """``word`` with its control characters escaped (ESC as ``\\x1b``): a file's words
    must not drive the terminal that prints them (set its title, clear it, move the
    cursor over other lines)."""
    if word.isprintable():
        return word
    return "".join(c.encode("unicode_escape").decode("ascii")
                   if unicodedata.category(c) == "Cc" else c for c in word)


def label(word: str, encoding: str | None = None) -> str:
    """``word`` as the table shows it: escaped (``shown``), and cut after ``SHOWN_CHARS``
    characters with its length said. A file of NUL bytes (a sparse file, a disk image) or
    a minified dump is one word of millions of characters: 20 MB of NULs took 29 s and
    1.6 GB to escape and print whole (168 MB on the terminal). With ``encoding``, the
    characters it cannot encode are escaped as printing would (``\\xe9``)."""
    text = (shown(word) if len(word) <= SHOWN_CHARS else
            f"{shown(word[:SHOWN_CHARS])}... ({len(word):,} characters)")
    if encoding is None:
        return text
    return text.encode(encoding, "backslashreplace").decode(encoding)


def format_top(counts: dict[str, int], k: int, encoding: str | None = None) -> list[str]:
    """The ``k`` most frequent words as table lines (ties broken alphabetically), the
    counts aligned in a terminal whatever columns the words take. ``encoding`` is the
    output's: a word is measured as it will be printed, escapes and all (the counts of
    escaped words stood out of line on an ASCII stdout)."""
    top = [(label(w, encoding), n)
           for w, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]
    width = max([columns(w) for w, _ in top] + [4])
    lines = [f"{'rank':>4}  {'word':<{width}}  {'count':>10}"]
    lines += [f"{i:>4}  {w}{' ' * (width - columns(w))}  {n:>10,}"
              for i, (w, n) in enumerate(top, 1)]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="actorpy wordcount",
                                     description="Count words in text files on a cluster.")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="text files, directories or globs (UTF-8, one line per record)")
    parser.add_argument("--top", type=int, default=20, metavar="K",
                        help="how many of the most frequent words the table shows (default "
                             "20; --json prints every word's count)")
    # --timeout as in every other app; --timeout-s, its first name, still works
    parser.add_argument("--timeout", "--timeout-s", dest="timeout_s",
                        type=apputil.positive_float, default=3600.0, metavar="S",
                        help="give up after this many seconds (default 3600)")
    parser.add_argument("--errors", choices=("strict", "replace"), default="strict",
                        help="an undecodable byte: fail naming file and offset (strict, the "
                             "default) or read it as U+FFFD (replace)")
    apputil.add_cluster_arguments(parser)
    args = parser.parse_args(argv)
    if args.top < 0:
        parser.error("--top must be >= 0")
    t0 = time.perf_counter()
    counting = False   # a timeout while connecting is not the count's --timeout
    try:
        mapre.list_inputs(args.paths)  # a missing input fails before a cluster starts
        with apputil.connect_from_args(args) as cluster:
            counting = True
            counts = word_counts(cluster, args.paths, timeout_s=args.timeout_s,
                                 errors=args.errors)
    except ConfigError:  # bad flags: the command line says so with status 2, as for sgd
        raise
    except ActorpyError as exc:
        bad = exc.__cause__ if isinstance(exc.__cause__, mapre.InputDecodeError) else None
        line = (f"{bad.path}: byte offset {bad.offset} is not valid UTF-8; fix the file, or "
                "pass `--errors replace` to read such bytes as U+FFFD" if bad is not None
                else str(exc.__cause__) if isinstance(exc.__cause__, (mapre.InputNotWords,
                                                                      mapre.InputChanged))
                # the engine's words name its timeout_s= ("pass a larger timeout_s")
                else f"counting did not finish within --timeout {args.timeout_s:g} s; "
                "raise --timeout" if isinstance(exc, ActorpyTimeout) and counting
                else apputil.error_line(exc))
        print(f"actorpy wordcount: {line}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - t0
    if args.json:
        apputil.print_json(counts)
        return 0
    if hasattr(sys.stdout, "reconfigure"):  # a word an ASCII or latin-1 stdout cannot
        sys.stdout.reconfigure(errors="backslashreplace")  # encode is printed escaped
    for line in format_top(counts, args.top, getattr(sys.stdout, "encoding", None)):
        print(line)
    print(f"{sum(counts.values()):,} words, {len(counts):,} distinct, in {seconds:.2f} s")
    return 0


DEMO_TEXT = """It was the best of times, it was the worst of times, it was the age of wisdom,
it was the age of foolishness, it was the epoch of belief, it was the epoch of incredulity,
it was the season of Light, it was the season of Darkness, it was the spring of hope,
it was the winter of despair, we had everything before us, we had nothing before us,
we were all going direct to Heaven, we were all going direct the other way
"""


def demo() -> None:
    """`actorpy demo` section: wordcount over a small generated corpus on 2 workers."""
    import actorpy

    print("\nwordcount (map-reduce engine): 2 workers, 200 copies of a Dickens opening "
          "in 4 files")
    with tempfile.TemporaryDirectory(prefix="actorpy-demo-") as tmp:
        for i in range(4):
            with open(os.path.join(tmp, f"part-{i}.txt"), "w", encoding="utf-8") as f:
                f.write(DEMO_TEXT * 50)
        t0 = time.perf_counter()
        with actorpy.connect(workers=2) as cluster:
            counts = word_counts(cluster, [tmp], timeout_s=120, progress=False)
        expected = Counter(w.lower() for w in DEMO_TEXT.split() if w.lower() not in STOP_WORDS)
        assert counts == {w: n * 200 for w, n in expected.items()}
        print(f"  {sum(counts.values()):,} words counted in {time.perf_counter() - t0:.2f} s "
              "(cluster start included); the top five:")
        for line in format_top(counts, 5):
            print("  " + line)


if __name__ == "__main__":
    from apps import run_as_command

    raise SystemExit(run_as_command("wordcount"))

"""Text input and output: listing and splitting inputs (driver), reading one split and
writing one part file (workers), and the output directory's commit protocol.

A split owns the lines that *start* inside its byte range: a reader seeks to ``start - 1``,
skips to the end of that line, and reads on until the line that covers byte ``end - 1`` is
complete, so every line is read exactly once however the file is cut (Hadoop's rule). Input
is read in blocks of a few MB cut at the last newline, so memory stays at one block (plus the
longest line) whatever the file size.

Output follows Hadoop/Spark: ``part-00000`` ... one per partition, each written under a
hidden temporary name and renamed when complete, then an empty ``_SUCCESS`` marker.
"""
from __future__ import annotations

import codecs
import glob
import os
import uuid
from typing import Any, Iterable, Iterator, Sequence

from engines.mapre.errors import (ArgumentError, InputChanged, InputDecodeError, InputNotFound,
                                  InputNotWords, OutputExists)
from engines.mapre.plan import Split

#: Bytes read per block; each block is decoded and split into lines in C.
READ_BLOCK_BYTES = 4 << 20
#: Bytes per block of ``read_split_text``: blocks are for code that splits them in C itself
#: (``block.split()``), and the pieces of a small block are still in the CPU's cache when
#: they are counted (a word count over 64 KB blocks: 5-10 % less CPU than over 4 MB, and
#: than over lines).
TEXT_BLOCK_BYTES = 64 << 10
#: With ``cut_long_lines``, the most bytes read with no whitespace to cut them at (one
#: "word"): a sparse file of 2 GB was held about five times over (read, joined, decoded,
#: lower-cased, split) and its one word sent to the driver.
MAX_WORD_BYTES = 64 << 20
#: The UTF-8 encodings of every character ``str.split()`` splits on (``str.isspace``): the
#: ASCII ones are bytes of their own; each other one starts with a lead byte and is whole, so
#: in UTF-8 it can only be that character, and a cut after it splits none. Text whose words
#: are parted by CR alone (old Mac files), VT or U+3000 was refused as "not words" when only
#: space and tab were cut at.
WORD_SEPARATORS = tuple(c.encode() for c in " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680"
                        "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
                        "\u200a\u2028\u2029\u202f\u205f\u3000")
#: Bytes at the end of a block searched for a separator first (real text has one there).
_SEPARATOR_TAIL = 256
#: Default size of one input split (one partition).
DEFAULT_SPLIT_BYTES = 32 << 20
SUCCESS = "_SUCCESS"
#: A UTF-8 byte order mark at the start of a file (Windows editors write one) is not text:
#: it is dropped, as Hadoop's line reader and Python's "utf-8-sig" do.
BOM = codecs.BOM_UTF8
_GLOB_CHARS = frozenset("*?[")


def _data_files(directory: str) -> list[str]:
    """Files in ``directory`` that hold data: names starting with ``_`` or ``.`` are
    markers and temporaries (``_SUCCESS``, ``.part-00000.x.tmp``), as in Hadoop."""
    names = sorted(n for n in os.listdir(directory) if not n.startswith(("_", ".")))
    return [os.path.join(directory, n) for n in names if os.path.isfile(os.path.join(directory, n))]


def _once_each(paths: Iterable[str]) -> list[str]:
    """``paths`` sorted, each file once: glob's "**" follows links to directories, and a
    link to a parent (``a/up -> ..``) names each file below it again and again until the
    path is too long (41 times each in a test); the shortest path to a file is kept."""
    first: dict[str, str] = {}
    for path in sorted(paths, key=lambda p: (p.count(os.sep), p)):
        first.setdefault(os.path.realpath(path), path)
    return sorted(first.values())


def list_inputs(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """The files named by a path, a directory, a glob, or a list of those (sorted per entry),
    as absolute paths: the workers that read them may run in another directory. A path
    with ``*``, ``?`` or ``[`` is a glob, as in the shell, even where a file has that very
    name; only a glob that matches nothing is taken as a name (``glob.escape`` makes a name
    with those characters a glob that matches only itself).

    Raises:
        InputNotFound: an entry names no file (missing path, empty glob, empty directory).
    """
    try:
        entries = [paths] if isinstance(paths, (str, bytes, os.PathLike)) else list(paths)
    except TypeError:  # not iterable: refused below
        entries = [paths]
    for entry in entries:
        if not isinstance(entry, (str, os.PathLike)):
            raise ArgumentError(f"mapre.load() takes paths as str or os.PathLike (or a list of "
                                f"them), got {type(entry).__name__}")
    if not entries:
        raise InputNotFound("mapre.load() was given an empty list of paths")
    files: list[str] = []
    for entry in entries:
        path = os.fspath(entry)
        # A pattern is expanded first, as the shell does: a file named "*.txt" is one of
        # the matches of "*.txt", not all of them (it was, and the other files were never
        # read). Only a pattern that matches nothing may name a file or directory itself.
        found = _matches(path) if _GLOB_CHARS & set(path) else []
        files.extend(found or _named(path))
    for path in files:
        if not os.access(path, os.R_OK):   # before: found by its worker, the others' work
            # done and thrown away
            raise InputNotFound(f"input file {path!r} cannot be read (permission denied)")
        if os.path.getsize(path) == 0 and _has_bytes(path):
            raise InputNotFound(f"input path {path!r} reports a size of 0 but holds data (a "
                                "/proc or /sys file): it cannot be cut into byte ranges; copy "
                                "it to a regular file first")
    if all(os.path.isabs(f) for f in files):   # from a deleted directory too: getcwd fails
        return files
    cwd = os.getcwd()  # joined, not normalised: "link/.." must stay what it is
    return [f if os.path.isabs(f) else os.path.join(cwd, f) for f in files]


def _named(path: str) -> list[str]:
    """The files ``path`` names itself (a file, or a directory's data files), where it is
    no pattern or a pattern that matched nothing.

    Raises:
        InputNotFound: it names no readable file, saying why.
    """
    if os.path.isdir(path):
        found = _data_files(path)
        if not found and not os.path.exists(os.path.join(path, SUCCESS)):
            raise InputNotFound(f"directory {path!r} holds no data files")
        return found
    if os.path.isfile(path):
        return [path]
    if _GLOB_CHARS & set(path):
        raise InputNotFound(f"the pattern {path!r} matches no file")
    if os.path.exists(path):
        raise InputNotFound(f"input path {path!r} is not a regular file or a directory "
                            "(a pipe, a device or a socket cannot be cut into byte ranges)")
    if os.path.islink(path):
        raise InputNotFound(f"input path {path!r} is a symbolic link to nothing (or a loop)")
    try:
        os.stat(path)
    except PermissionError:   # a directory on its way that cannot be entered: exists() says
        # False, and "does not exist" sent the user looking for a file that is there
        raise InputNotFound(f"input path {path!r} cannot be reached: a directory on its way "
                            "cannot be entered (permission denied)") from None
    except OSError:
        pass
    raise InputNotFound(f"input path {path!r} does not exist")


def _matches(pattern: str) -> list[str]:
    """The files ``pattern`` matches, sorted; "**" spans directories, as in the shell's
    globstar and pathlib."""
    found = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
    # glob passes over a directory it cannot list, as the shell does; a count short of
    # that directory's files with no word of it is worse than an error
    head = os.path.dirname(pattern) or os.curdir
    if "**" in pattern:   # every directory below the "**": any could hold matches
        dirs = glob.glob(os.path.join(pattern.split("**")[0] + "**", ""), recursive=True)
    else:
        dirs = (glob.glob(os.path.join(head, "")) if _GLOB_CHARS & set(head) else [head])
    for folder in dirs:
        if os.path.isdir(folder) and not os.access(folder, os.R_OK | os.X_OK):
            raise InputNotFound(f"the pattern {pattern!r} reaches directory "
                                f"{folder.rstrip(os.sep) or folder!r}, which cannot be read "
                                "(permission denied): its files would be left out")
    return _once_each(found) if "**" in pattern else sorted(found)


def _has_bytes(path: str) -> bool:
    """Whether a file that reports size 0 has bytes to read all the same (a kernel file,
    as /proc/cpuinfo): it would count as empty. Read without blocking (/proc/kmsg waits
    for news); one that cannot be opened is left to the reader to report."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return bool(os.read(fd, 1))
    except BlockingIOError:  # nothing now, more later: no file of fixed bytes either
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def make_splits(files: Iterable[str], split_bytes: int) -> list[Split]:
    """Cut each non-empty file into the fewest byte ranges of at most ``split_bytes``, all
    of about the same size (so no small last split makes some worker finish early)."""
    if split_bytes < 1:
        raise ValueError(f"split_bytes must be >= 1, got {split_bytes}")
    splits = []
    for path in files:
        size = os.path.getsize(path)
        n = -(-size // split_bytes)
        splits.extend(Split(path, i * size // n, (i + 1) * size // n) for i in range(n))
    return splits


def pack_splits(splits: Sequence[Split], split_bytes: int,
                workers: int = 1) -> list[tuple[Split, ...]]:
    """Splits packed into partitions, in order: a partition takes the next split while it
    stays within ``split_bytes`` and within an even share of the whole input per worker. So
    small files share a partition, as Hadoop's CombineFileInputFormat and Spark's file
    sources do (a thousand small books are not a thousand tasks, each with its own partial
    result to merge), and every worker still gets a partition.

    >>> parts = pack_splits([Split(f, 0, n) for f, n in zip("abcd", (10, 10, 10, 50))], 30, 2)
    >>> [[s.path for s in part] for part in parts]
    [['a', 'b', 'c'], ['d']]
    """
    total = sum(s.end - s.start for s in splits)
    limit = min(split_bytes, -(-total // max(1, workers)))
    parts: list[tuple[Split, ...]] = []
    current: list[Split] = []
    size = 0
    for split in splits:
        n = split.end - split.start
        if current and size + n > limit:
            parts.append(tuple(current))
            current, size = [], 0
        current.append(split)
        size += n
    if current:
        parts.append(tuple(current))
    return parts


def read_split(split: Split, errors: str = "strict",
               block_bytes: int = READ_BLOCK_BYTES) -> Iterator[list[str]]:
    """The lines of ``split`` as lists of str, one list per block read (``\\n`` and
    ``\\r\\n`` stripped, and a byte order mark at the start of the file).

    Raises:
        InputDecodeError: a byte is not valid UTF-8 and ``errors`` is "strict".
    """
    for pos, body in _without_bom(read_blocks(split, block_bytes)):
        text = _decode(body, split.path, pos, errors)
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        lines = text.split("\n")
        if body.endswith(b"\n"):  # the last piece is empty (not so for a final unended line)
            lines.pop()
        yield lines


def read_split_text(split: Split, errors: str = "strict",
                    block_bytes: int = TEXT_BLOCK_BYTES,
                    cut_long_lines: bool = False) -> Iterator[str]:
    """The lines of ``split`` as blocks of text: whole lines of about ``block_bytes``
    together, line ends kept as they are (``\\n`` or ``\\r\\n``); every block ends with a
    newline but perhaps the file's last. A byte order mark at the start of the file is dropped.
    With ``cut_long_lines`` a line longer than a block is cut after a whitespace character
    in it (read_blocks).

    Raises:
        InputDecodeError: a byte is not valid UTF-8 and ``errors`` is "strict".
    """
    for pos, body in _without_bom(read_blocks(split, block_bytes, cut_long_lines)):
        yield _decode(body, split.path, pos, errors)


def read_blocks(split: Split, block_bytes: int = READ_BLOCK_BYTES,
                cut_long_lines: bool = False) -> Iterator[tuple[int, bytes]]:
    """``(file offset, bytes)`` of the whole lines that start in ``split``, a block of
    about ``block_bytes`` at a time, each ending with a newline (but the file's last).

    With ``cut_long_lines`` a block that holds no newline ends after its last whitespace
    character (``WORD_SEPARATORS``) instead, so that a line of words longer than a block
    (text8 is one line of 100 MB) is read a block at a time rather than held whole, and
    copied, by every step that reads it. The cut splits no character and no word (each
    separator is whitespace to ``str.split``), and lower-casing the pieces is lower-casing
    the line (whitespace is neither cased nor case-ignorable, so final sigma reads the same).
    """
    with open(split.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < split.end:   # it was longer when listed: its lines past size would be lost
            raise _shorter(split, size)
        pos = split.start  # file offset of the first byte not yet returned
        if pos > 0:  # the line covering start - 1 belongs to the split before
            f.seek(pos - 1)
            pos -= 1
            while True:  # a piece at a time: that line may be longer than memory
                skipped = f.readline(block_bytes)
                pos += len(skipped)
                if not skipped or skipped.endswith(b"\n"):
                    break
        carry: list[bytes] = []
        in_line = False  # part of the line at pos was returned already (cut_long_lines)
        while pos < split.end or in_line:
            block = f.read(block_bytes)
            if not block:  # end of file: the last line has no newline
                if pos + sum(map(len, carry)) < split.end:
                    # cut short while this split was read: its last lines were lost without
                    # a word (a count came out short)
                    raise _shorter(split, os.fstat(f.fileno()).st_size)
                if carry:
                    yield pos, b"".join(carry)
                return
            cut = block.rfind(b"\n")
            if cut < 0:
                after = _after_last_separator(block) if cut_long_lines else 0
                if not after:
                    carry.append(block)
                    if cut_long_lines and len(carry) * block_bytes > MAX_WORD_BYTES:
                        raise _not_words(split, pos, carry)
                    continue
                body = b"".join([*carry, block[:after]])
                yield pos, body
                pos += len(body)
                carry = [block[after:]] if after < len(block) else []
                in_line = True
                continue
            body = b"".join([*carry, block[:cut + 1]]) if carry else block[:cut + 1]
            rest = block[cut + 1:]
            done = pos + len(body) > split.end
            if done:  # keep the lines that start before end (the one under way is ours)
                body = body[:body.find(b"\n", max(split.end - 1 - pos, 0)) + 1]
            yield pos, body
            if done:
                return
            pos += len(body)
            carry = [rest] if rest else []
            in_line = False


def _after_last_separator(block: bytes) -> int:
    """The index just past the last whitespace character in ``block`` (0: none). The tail
    is searched first: looking for each of the separators through a whole block, where most
    never occur, would scan it some thirty times."""
    for start in (max(0, len(block) - _SEPARATOR_TAIL), 0):
        found = max((i + len(sep) for sep in WORD_SEPARATORS
                     if (i := block.rfind(sep, start)) >= 0), default=0)
        if found or start == 0:
            return found
    return 0


def _not_words(split: Split, pos: int, carry: list[bytes]) -> InputNotWords:
    """The error for ``carry``, a stretch with no whitespace: binary only if it looks so."""
    sample = carry[0][:4096]
    try:
        sample.decode("utf-8")
        binary = b"\x00" in sample
    except UnicodeDecodeError as exc:
        binary = exc.start < len(sample) - 3   # not just a character cut at the sample's end
    why = ("not text made of words (a binary or sparse file?)" if binary else
           "one word longer than a worker holds: words must be parted by whitespace (space, "
           "tab, line end, or another character str.split() splits on)")
    return InputNotWords(f"{split.path}: the {sum(map(len, carry)):,} bytes from offset {pos} "
                         f"hold no whitespace: {why}")


def _shorter(split: Split, size: int) -> InputChanged:
    # split.end is where this split ends, not the file's size when listed (a file of 19
    # bytes cut into splits was said to have had 12, its first split's end)
    return InputChanged(f"{split.path} is {size:,} bytes now, but this job reads it up to "
                        f"byte {split.end:,}: it was truncated or rewritten since the job "
                        "listed its input; run the job again once the file stays as it is")


def _without_bom(blocks: Iterator[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    """``blocks`` of ``read_blocks``, less a byte order mark at the start of the file."""
    for pos, body in blocks:
        if pos == 0 and body.startswith(BOM):
            pos, body = len(BOM), body[len(BOM):]
        if body:
            yield pos, body
        yield from blocks  # only the first block can start the file
        return


def _decode(data: bytes, path: str, offset: int, errors: str) -> str:
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        bad = data[exc.start:exc.start + 4].hex(" ")
        raise InputDecodeError(path, offset + exc.start, f"{exc.reason}, bytes {bad}") from None


def prepare_output(directory: str, overwrite: bool) -> None:
    """Make ``directory`` ready for ``save``, before any work starts.

    Raises:
        OutputExists: it already holds files and ``overwrite`` is False, or it holds
            anything but a previous save's output (``overwrite`` or not).
    """
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise OutputExists(f"output path {directory!r} is a file, not a directory; choose a "
                           "new directory")
    if os.path.isdir(directory) and os.listdir(directory):
        if not overwrite:
            raise OutputExists(f"output directory {directory!r} is not empty; choose a new "
                               "directory or pass overwrite=True")
        # Only a previous save's output is replaced: save("/", overwrite=True) wrote its
        # parts next to /etc, and a later load of the directory read every file there.
        with os.scandir(directory) as entries:
            names = sorted(e.name for e in entries)
        foreign = [n for n in names if not _is_saved(directory, n)]
        if foreign:
            shown = ", ".join(map(repr, foreign[:3]))
            more = f" and {len(foreign) - 3:,} more" if len(foreign) > 3 else ""
            raise OutputExists(f"output directory {directory!r} holds entries no save wrote "
                               f"({shown}{more}); overwrite=True replaces only a previous "
                               "save's part-NNNNN files and _SUCCESS: choose a new or empty "
                               "directory")
        for name in names:
            os.remove(os.path.join(directory, name))
    os.makedirs(directory, exist_ok=True)
    if not os.access(directory, os.W_OK | os.X_OK):   # before: found by the first worker
        # to write a part, after the work upstream of the save was done
        raise OutputExists(f"output directory {directory!r} cannot be written to "
                           "(permission denied); choose another directory")


def _is_saved(directory: str, name: str) -> bool:
    """Whether ``name`` in ``directory`` is a file that ``save`` writes: a part, a part's
    temporary (left by a worker that died mid-write) or the ``_SUCCESS`` marker."""
    if _part_number(name) is None and not _is_part_tmp(name) and name != SUCCESS:
        return False
    path = os.path.join(directory, name)
    return os.path.isfile(path) and not os.path.islink(path)


def _part_number(name: str) -> int | None:
    """N of a ``part-N`` file's name (``part_name``), else None."""
    return int(name[5:]) if name.startswith("part-") and name[5:].isdigit() else None


def _is_part_tmp(name: str) -> bool:
    """Whether ``name`` is a part's temporary (``write_part``)."""
    return name.startswith(".part-") and name.endswith(".tmp")


def part_name(part: int) -> str:
    return f"part-{part:05d}"


def write_part(items: Iterable[Any], directory: str, part: int) -> tuple[int, int]:
    """Write one partition as ``part-NNNNN`` (one line per item, ``str()`` of non-str items);
    readers never see a partial file. Returns (lines, bytes)."""
    final = os.path.join(directory, part_name(part))
    tmp = os.path.join(directory, f".{part_name(part)}.{uuid.uuid4().hex}.tmp")
    rows = 0
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            batch: list[str] = []
            for item in items:
                batch.append(item if type(item) is str else str(item))
                if len(batch) >= 8192:
                    rows += len(batch)
                    f.write("\n".join(batch) + "\n")
                    batch = []
            if batch:
                rows += len(batch)
                f.write("\n".join(batch) + "\n")
            size = f.tell()
        os.replace(tmp, final)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(exc, OSError) and exc.filename is None:
            # a failed write names no file ("No space left on device"): name the part
            raise OSError(exc.errno, exc.strerror, final) from exc
        raise
    return rows, size


def finish_output(directory: str, parts: int) -> None:
    """Remove leftovers of failed attempts and parts beyond ``parts``, then mark success."""
    for name in os.listdir(directory):
        number = _part_number(name)
        if _is_part_tmp(name) or (number is not None and number >= parts):
            os.remove(os.path.join(directory, name))
    with open(os.path.join(directory, SUCCESS), "w"):
        pass

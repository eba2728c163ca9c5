"""Where a worker's object store puts what does not fit its memory budget: one file per
stored segment in a private (0700) directory, read back by ``mmap`` without a copy.

The directory is made on the first spill, inside ``store_dir`` when given (the embedded local
cluster passes its own private directory, so a killed worker's files go with the cluster),
else in the system's temporary directory; ``SpillDir.close`` removes it.
"""
from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from actorpy.errors import StoreError

#: Frames start at multiples of this in a spill file, so arrays read back are aligned.
ALIGN_BYTES = 64
#: Files smaller than this are read into memory; larger ones are memory-mapped.
MMAP_MIN_BYTES = 1 << 20
#: The default budget keeps this fraction of the machine's memory for the stores of its
#: local workers together (the rest is for the tasks' own data and the page cache).
MEMORY_FRACTION = 0.25
_ZEROS = bytes(ALIGN_BYTES)


def physical_memory_bytes() -> int:
    """This machine's memory, or the container's limit when that is lower (cgroup v2/v1)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw.isdigit() and 0 < int(raw) < total:
            total = int(raw)
    return total


def default_budget_bytes(workers: int | None) -> int:
    """A quarter of physical memory (or the cgroup limit) divided by the local worker count
    (``workers``, else the number of cores), at least 64 MiB."""
    count = workers if workers else (os.cpu_count() or 1)
    return max(64 << 20, int(physical_memory_bytes() * MEMORY_FRACTION / count))


@dataclass(frozen=True)
class SpillFile:
    """Where one spilled segment's frames lie: (offset, size) per frame."""

    path: str
    extents: tuple[tuple[int, int], ...]

    @property
    def nbytes(self) -> int:
        return sum(size for _, size in self.extents)


class SpillDir:
    """A private directory of spill files, made on first use.

    Args:
        root: the parent directory (None: the system's temporary directory).
        name: a readable part of the directory's name (the worker's id).
    """

    def __init__(self, root: str | None, name: str) -> None:
        self._root = root
        self._name = name
        self._path: str | None = None
        self._lock = threading.Lock()
        self._seq = 0
        self._closed = False

    @property
    def path(self) -> str | None:
        """The directory, once something has spilled."""
        return self._path

    def write(self, frames: Sequence[Any]) -> SpillFile:
        """Write frames to a fresh file (straight from their memory, no staging copy).

        Raises:
            StoreError: the file cannot be written (disk full, directory gone...).
        """
        path = self._next_path()
        extents: list[tuple[int, int]] = []
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                offset = 0
                for frame in frames:
                    pad = -offset % ALIGN_BYTES
                    if pad:
                        _write_all(fd, memoryview(_ZEROS)[:pad])
                        offset += pad
                    view = memoryview(frame).cast("B")
                    _write_all(fd, view)
                    extents.append((offset, view.nbytes))
                    offset += view.nbytes
            finally:
                os.close(fd)
        except OSError as exc:
            _unlink(path)
            raise StoreError(f"cannot spill a block to {path}: {exc.strerror or exc}; free disk "
                             "space there, point store_dir (ACTORPY_STORE_DIR) at a larger "
                             "disk, or delete blocks no longer needed") from exc
        return SpillFile(path, tuple(extents))

    def _next_path(self) -> str:
        with self._lock:
            if self._closed:
                raise StoreError("the object store is closed")
            if self._path is None:
                if self._root is not None:
                    os.makedirs(self._root, mode=0o700, exist_ok=True)
                # mkdtemp makes the directory with mode 0700: only this user can read spills.
                self._path = tempfile.mkdtemp(prefix=f"actorpy-store-{self._name}-",
                                              dir=self._root)
            self._seq += 1
            return os.path.join(self._path, f"{self._seq}.seg")

    def close(self) -> None:
        """Remove the directory and every file in it (idempotent)."""
        with self._lock:
            self._closed = True
            path, self._path = self._path, None
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)


def read_frames(spilled: SpillFile) -> tuple[memoryview, ...]:
    """The frames of a spilled segment: views of a read-only ``mmap`` (no copy; the pages are
    read when used), or of one ``bytes`` for a small file.

    Raises:
        FileNotFoundError: the file is gone (its key was deleted).
    """
    with open(spilled.path, "rb") as f:
        end = spilled.extents[-1][0] + spilled.extents[-1][1] if spilled.extents else 0
        if end >= MMAP_MIN_BYTES:
            data: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        else:
            data = f.read()
    view = memoryview(data)
    return tuple(view[offset:offset + size] for offset, size in spilled.extents)


def remove(spilled: SpillFile) -> None:
    """Delete a spill file (a reader that mapped it keeps its pages until it lets go)."""
    _unlink(spilled.path)


def _write_all(fd: int, view: memoryview) -> None:
    while view.nbytes:
        written = os.write(fd, view)
        view = view[written:]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

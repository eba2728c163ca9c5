"""A worker's object store: blocks that other workers fetch (shuffle blocks, broadcast values),
kept serialized within a byte budget; what does not fit is spilled to files.

* A block is one value (``put``) or a stream of items kept in segments of about 1 MB
  (``put_stream``): a reader can then consume a block many times its own memory, one
  segment at a time (``Caller.fetch_iter``, ``iterate`` here).
* ``put`` stores a snapshot: array data is copied once into the store (or written straight
  to a spill file), so changing an array after ``put`` does not change the block.
* Budget: the frames of blocks held in memory, plus ``ENTRY_OVERHEAD_BYTES`` per segment,
  never exceed ``budget_bytes``. A segment that does not fit goes to a file in a private
  directory (first come, first kept in memory; nothing moves when room frees up). Spilled
  segments are served from a read-only ``mmap``: no copy, pages read as they are sent.
* Keys are strings; ``/`` separates levels (``"job-7/stage-2/part-13"``), and
  ``delete(prefix)`` costs O(keys removed), not a scan of the store (see keyindex).
* Thread-safe: tasks, services and the I/O thread (which serves fetches) share it; pickling
  and file writes happen outside the lock.
* A block put by a task belongs to the node that submitted the task (its ``owner``): when
  that node leaves or dies, ``drop_owner`` deletes its blocks, and a put for it afterwards
  (a task of its still finishing) stores nothing. A driver killed, or stopped with Ctrl-C
  while a map task was storing its buckets, left them on its workers for good.

How a fetch is answered (``serve``): a key (str) gets the whole block — the value, or for a
stream the list of all its items as a ``serde.JoinedLists`` (segments sent as they are
stored); a ``SegmentRequest`` gets a ``StreamHead`` (index ``HEAD``) or one segment.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from actorpy.errors import StoreError
from actorpy.runtime import spill
from actorpy.runtime.keyindex import KeyIndex
from actorpy.wire import message as wm
from actorpy.wire import serde

#: Memory counted per segment besides its frames (index entries, Python objects).
ENTRY_OVERHEAD_BYTES = 256
#: ``put_stream`` pickles items in batches of about this many bytes. A batch is in memory
#: twice while it is pickled, as Python objects and in the pickler's memo: for small records
#: (str, int) that is ~18x the pickled size (measured: +18 MB at 1 MiB, +72 MB at 4 MiB),
#: and smaller batches pickle no slower, so 1 MiB.
DEFAULT_SEGMENT_BYTES = 1 << 20
#: ``SegmentRequest.index`` asking for the block's ``StreamHead``.
HEAD = -1
#: departed owners a store remembers (a task of one may still be finishing its puts)
MAX_GONE_OWNERS = 4096


@dataclass(frozen=True)
class StoreStats:
    """A snapshot of a store's use (for tests and monitoring)."""

    keys: int
    segments: int
    memory_bytes: int    # frames held in memory + ENTRY_OVERHEAD_BYTES per in-memory segment
    spilled_bytes: int   # frames in spill files
    spill_files: int
    budget_bytes: int
    spill_dir: str | None


@dataclass(frozen=True)
class StreamHead:
    """A block's shape: what a ``SegmentRequest`` for ``HEAD`` is answered with."""

    version: int     # changes when the key is stored again
    segments: int
    stream: bool     # stored by put_stream (segments are lists of items)
    nbytes: int


@dataclass(frozen=True)
class SegmentRequest:
    """Ask for segment ``index`` of ``key`` (or its ``StreamHead`` with ``HEAD``); a nonzero
    ``version`` must match the block's, so a reader never mixes two versions of a key."""

    key: str
    index: int
    version: int = 0


@dataclass(frozen=True, slots=True)
class _Segment:
    frames: tuple[Any, ...] | None     # in memory, owned by the store
    spilled: spill.SpillFile | None    # or on disk
    has_layout: bool
    nbytes: int


@dataclass(frozen=True, slots=True)
class _Block:
    segments: tuple[_Segment, ...]
    stream: bool
    version: int
    owner: str | None = None

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segments)


class ObjectStore:
    """Blocks kept by one worker for others to fetch.

    Args:
        budget_bytes: memory the blocks may use; beyond it segments spill to files.
        chunk_bytes: frame size for stored blocks (the node's, so they are sent as stored).
        store_dir: parent of the spill directory (None: the system's temporary directory).
        name: who owns the store, for the spill directory's name and error messages.
    """

    def __init__(self, *, budget_bytes: int, chunk_bytes: int = serde.DEFAULT_CHUNK_BYTES,
                 store_dir: str | None = None, name: str = "worker") -> None:
        if budget_bytes < 0 or chunk_bytes < 1:
            raise ValueError("need budget_bytes >= 0 and chunk_bytes >= 1")
        self.budget_bytes = budget_bytes
        self.name = name
        self._chunk_bytes = chunk_bytes
        self._spill = spill.SpillDir(store_dir, name)
        self._lock = threading.Lock()
        self._blocks: dict[str, _Block] = {}
        self._index = KeyIndex()
        self._versions = itertools.count(1)
        self._memory = 0
        self._spilled = 0
        self._files = 0
        self._segments = 0
        self._closed = False
        #: owners that left or died (the latest MAX_GONE_OWNERS): their puts store nothing
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._owned: dict[str, set[str]] = {}   # owner -> its keys

    # ------------------------------------------------------------------ writing
    def put(self, key: str, value: Any, *, owner: str | None = None) -> int:
        """Store ``value`` (a snapshot) under ``key``, replacing what was there; returns its
        size in bytes. ``owner``: the node it belongs to (see ``drop_owner``).

        Raises:
            SerializationError: ``value`` cannot be pickled.
            StoreError: it had to spill and the spill file could not be written, or its
                owner is gone.
        """
        _check_key(key)
        segment = self._keep(wm.Encoded.of(value, self._chunk_bytes))
        self._publish(key, [segment], stream=False, owner=owner)
        return segment.nbytes

    def put_stream(self, key: str, items: Iterable[Any], *,
                   segment_bytes: int = DEFAULT_SEGMENT_BYTES, owner: str | None = None) -> int:
        """Store the items of ``items`` under ``key`` as a stream, pickled in batches of about
        ``segment_bytes``; each batch is kept or spilled as soon as it is pickled, so the
        items need never be in memory together. The block appears when ``items`` is
        exhausted (a failure stores nothing). Returns the block's size in bytes.

        Raises:
            SerializationError, StoreError: as for ``put``; or whatever ``items`` raises.
        """
        _check_key(key)
        if segment_bytes < 1:
            raise ValueError("segment_bytes must be >= 1")
        segments: list[_Segment] = []
        try:
            for encoded in _batches(items, segment_bytes, self._chunk_bytes):
                segments.append(self._keep(encoded))
            if not segments:
                segments.append(self._keep(wm.Encoded.of([], self._chunk_bytes)))
        except BaseException:
            with self._lock:
                doomed = self._uncount(segments)
            _remove_files(doomed)
            raise
        self._publish(key, segments, stream=True, owner=owner)
        return sum(s.nbytes for s in segments)

    def _keep(self, encoded: wm.Encoded) -> _Segment:
        size = encoded.nbytes
        with self._lock:
            if self._closed:
                raise StoreError(f"the object store of {self.name} is closed")
            fits = self._memory + size + ENTRY_OVERHEAD_BYTES <= self.budget_bytes
            if fits:
                self._memory += size + ENTRY_OVERHEAD_BYTES
                self._segments += 1
        if fits:
            try:
                frames = encoded.snapshot().frames
            except BaseException:
                with self._lock:
                    self._memory -= size + ENTRY_OVERHEAD_BYTES
                    self._segments -= 1
                raise
            return _Segment(frames, None, encoded.has_buffers, size)
        spilled = self._spill.write(encoded.frames)
        with self._lock:
            self._spilled += size
            self._files += 1
            self._segments += 1
        return _Segment(None, spilled, encoded.has_buffers, size)

    def _publish(self, key: str, segments: list[_Segment], stream: bool,
                 owner: str | None) -> None:
        with self._lock:
            closed = self._closed
            gone = owner is not None and owner in self._gone
            if closed or gone:
                doomed = self._uncount(segments)
            else:
                old = self._blocks.get(key)
                self._blocks[key] = _Block(tuple(segments), stream, next(self._versions),
                                           owner)
                if old is None:
                    self._index.add(key)
                else:
                    self._disown(key, old.owner)
                if owner is not None:
                    self._owned.setdefault(owner, set()).add(key)
                doomed = self._uncount(old.segments) if old is not None else []
        _remove_files(doomed)
        if closed:
            raise StoreError(f"the object store of {self.name} is closed")
        if gone:
            raise StoreError(f"{key!r} belongs to {owner}, which is gone: not stored")

    def _uncount(self, segments: Iterable[_Segment]) -> list[spill.SpillFile]:
        """Take segments off the books (caller holds the lock); returns their files."""
        files = []
        for seg in segments:
            self._segments -= 1
            if seg.spilled is not None:
                self._spilled -= seg.nbytes
                self._files -= 1
                files.append(seg.spilled)
            else:
                self._memory -= seg.nbytes + ENTRY_OVERHEAD_BYTES
        return files

    # ------------------------------------------------------------------ deleting
    def delete(self, prefix: str) -> int:
        """Remove every key that starts with ``prefix`` and its spill files; returns how many.
        Costs O(keys removed): ``delete("job-7/")`` never looks at other jobs' keys."""
        with self._lock:
            keys = self._index.pop_prefix(prefix)
            doomed: list[spill.SpillFile] = []
            for key in keys:
                block = self._blocks.pop(key)
                self._disown(key, block.owner)
                doomed.extend(self._uncount(block.segments))
        _remove_files(doomed)
        return len(keys)

    def drop_owner(self, owner: str) -> int:
        """``owner`` left or died: delete its blocks, and store none of its puts from now on.
        Returns how many were deleted. O(its blocks)."""
        with self._lock:
            self._gone[owner] = None
            while len(self._gone) > MAX_GONE_OWNERS:
                self._gone.popitem(last=False)
            keys = self._owned.pop(owner, set())
            doomed: list[spill.SpillFile] = []
            for key in keys:
                self._index.discard(key)
                doomed.extend(self._uncount(self._blocks.pop(key).segments))
        _remove_files(doomed)
        return len(keys)

    def _disown(self, key: str, owner: str | None) -> None:
        """``key`` no longer belongs to ``owner`` (caller holds the lock)."""
        keys = self._owned.get(owner) if owner is not None else None
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._owned[owner]   # type: ignore[arg-type]

    def close(self) -> None:
        """Drop every block and remove the spill directory (idempotent)."""
        with self._lock:
            self._closed = True
            self._blocks.clear()
            self._owned.clear()
            self._index = KeyIndex()
            self._memory = self._spilled = self._files = self._segments = 0
        self._spill.close()

    # ------------------------------------------------------------------ reading
    def keys(self, prefix: str = "") -> list[str]:
        """The stored keys that start with ``prefix`` (for monitoring and tests)."""
        with self._lock:
            return [key for key in self._blocks if key.startswith(prefix)]

    def get(self, key: str) -> Any:
        """The value under ``key`` (a stream's items as one list). Arrays come back read-only,
        sharing the store's memory (or its spill file's pages), as Ray's object store does.

        Raises:
            KeyError: nothing is stored under ``key``.
        """
        block = self._block(key)
        if not block.stream:
            return self._encoded(key, block.segments[0]).decode()
        return [item for seg in block.segments for item in self._encoded(key, seg).decode()]

    def iterate(self, key: str) -> Iterator[Any]:
        """The items of the block under ``key``, one segment in memory at a time (a block
        stored by ``put`` yields the items of its value).

        Raises:
            KeyError: nothing is stored under ``key`` (or it is deleted while being read).
            TypeError: the value stored by ``put`` is not iterable.
        """
        block = self._block(key)
        for seg in block.segments:
            part = self._encoded(key, seg).decode()
            yield from part if block.stream else _items_of(key, part)

    def serve(self, request: Any) -> wm.Encoded | StreamHead | serde.JoinedLists:
        """The answer to a fetch (see the module docstring); runs on the I/O thread, so it
        only looks things up and maps files: nothing is unpickled or copied.

        Raises:
            KeyError: no such key (or version). IndexError: no such segment.
            TypeError: a malformed request.
        """
        if isinstance(request, str):
            block = self._block(request)
            if not block.stream:
                return self._encoded(request, block.segments[0])
            return serde.JoinedLists([(self._encoded(request, s).frames, s.has_layout)
                                      for s in block.segments])
        if not isinstance(request, SegmentRequest) or not isinstance(request.key, str):
            raise TypeError(f"a fetch asks for a key (str) or a SegmentRequest, "
                            f"not {type(request).__name__}")
        block = self._block(request.key)
        if request.version and request.version != block.version:
            raise KeyError(f"{request.key!r} was stored again on {self.name} while being read")
        if request.index == HEAD:
            return StreamHead(block.version, len(block.segments), block.stream, block.nbytes)
        if not 0 <= request.index < len(block.segments):
            raise IndexError(f"{request.key!r} on {self.name} has {len(block.segments)} "
                             f"segments, not {request.index + 1}")
        return self._encoded(request.key, block.segments[request.index])

    def _block(self, key: str) -> _Block:
        with self._lock:
            block = self._blocks.get(key)
        if block is None:
            raise KeyError(f"{key!r} is not stored on {self.name}")
        return block

    def _encoded(self, key: str, seg: _Segment) -> wm.Encoded:
        if seg.frames is not None:
            return wm.Encoded(seg.frames, seg.has_layout)
        assert seg.spilled is not None
        try:
            return wm.Encoded(spill.read_frames(seg.spilled), seg.has_layout)
        except FileNotFoundError:
            raise KeyError(f"{key!r} was deleted from {self.name} while being read") from None

    # ------------------------------------------------------------------ inspecting
    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(len(self._blocks), self._segments, self._memory, self._spilled,
                              self._files, self.budget_bytes, self._spill.path)


def _check_key(key: Any) -> None:
    if not isinstance(key, str) or not key:
        raise TypeError(f"a store key is a non-empty str, not {key!r}")


def _items_of(key: str, value: Any) -> Iterable[Any]:
    try:
        return iter(value)
    except TypeError:
        raise TypeError(f"{key!r} holds a {type(value).__name__}, which is not iterable; "
                        "read it with fetch()/get(), or store it with put_stream()") from None


def _batches(items: Iterable[Any], segment_bytes: int, chunk_bytes: int) -> Iterator[wm.Encoded]:
    """Pickle ``items`` in lists of about ``segment_bytes``, sizing each batch from the
    pickled size per item seen so far (growing at most 16x a batch, so one small first item
    cannot make a giant batch)."""
    batch: list[Any] = []
    limit = 16
    for item in items:
        batch.append(item)
        if len(batch) >= limit:
            encoded = wm.Encoded.of(batch, chunk_bytes)
            yield encoded
            per_item = max(1.0, encoded.nbytes / len(batch))
            limit = max(1, min(limit * 16, int(segment_bytes / per_item)))
            batch = []
    if batch:
        yield wm.Encoded.of(batch, chunk_bytes)


def _remove_files(files: Iterable[spill.SpillFile]) -> None:
    for f in files:
        spill.remove(f)

"""What runs on the workers: a partition task computes one partition from its *spec* (the
fused lineage of that partition, with the locations of its inputs filled in by the driver)
and hands the items to a *sink* (write shuffle buckets, count, collect, save, ...).

Specs and sinks are small frozen objects pickled with the task; user functions travel
inside them by value (cloudpickle), data never does except for ``from_items`` partitions.
"""
from __future__ import annotations

import heapq
import random
import sys
import time
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Any, Callable, Iterable, Iterator, Protocol

from engines.mapre import io
from engines.mapre.broadcast import bind as bind_task_context
from engines.mapre.broadcast import unbind as unbind_task_context
from engines.mapre.ops import Op, apply_ops
from engines.mapre.plan import Split
from engines.mapre.shuffle import (Block, ShuffleSpec, bucket, combined_chunks, fetch_blocks,
                                   merge, reduce_values, store_block)


@dataclass
class TaskEnv:
    """One task's view: the worker context, the fetch timeout, and what it reports back."""

    ctx: Any
    fetch_timeout_s: float
    rows_in: int = 0
    bytes_in: int = 0
    cached: list[tuple[int, int, int]] = field(default_factory=list)  # (cache, part, chunks)


@dataclass(frozen=True)
class TaskOutcome:
    """What a partition task reports: the sink's value and a few counters."""

    value: Any
    rows_in: int
    bytes_in: int
    rows_out: int
    cached: tuple[tuple[int, int, int], ...]
    seconds: float


class Spec(Protocol):
    def items(self, env: TaskEnv) -> Iterable[Any]: ...


class Sink(Protocol):
    def run(self, env: TaskEnv, items: Iterable[Any]) -> tuple[Any, int]: ...


# ------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class ReadSplits:
    splits: tuple[Split, ...]
    errors: str
    raw: bool = False  # items are blocks of whole lines (str), not lines
    cut_long_lines: bool = False  # raw: a line longer than a block is cut between words

    def items(self, env: TaskEnv) -> Iterator[Any]:
        env.bytes_in += sum(s.end - s.start for s in self.splits)
        if self.raw:
            return self._text(env)
        return chain.from_iterable(self._blocks(env))

    # A task whose job was given up (Ctrl-C, a timeout, its driver gone) stops at its next
    # block: reading on, it held its worker for as long as its whole input took (27 s for
    # the next job's first task after a Ctrl-C'd count of 270 MB here).
    def _text(self, env: TaskEnv) -> Iterator[str]:
        for split in self.splits:
            for block in io.read_split_text(split, self.errors,
                                            cut_long_lines=self.cut_long_lines):
                env.ctx.check_cancelled()
                yield block

    def _blocks(self, env: TaskEnv) -> Iterator[list[str]]:
        for split in self.splits:
            for lines in io.read_split(split, self.errors):
                env.ctx.check_cancelled()
                env.rows_in += len(lines)
                yield lines


@dataclass(frozen=True)
class ReadItems:
    data: list[Any]

    def items(self, env: TaskEnv) -> Iterator[Any]:
        env.rows_in += len(self.data)
        return iter(self.data)


@dataclass(frozen=True)
class NarrowSpec:
    child: Spec
    ops: tuple[Op, ...]

    def items(self, env: TaskEnv) -> Iterable[Any]:
        return apply_ops(self.child.items(env), self.ops)


@dataclass(frozen=True)
class ReadCached:
    """A stored partition (of a cache, or of the sample pass of a sort)."""

    node: str
    key: str
    chunks: int
    consume: bool = False  # delete it once read here (single-use, job-scoped)

    def items(self, env: TaskEnv) -> Iterator[Any]:
        return chain.from_iterable(self._chunks(env))

    def _chunks(self, env: TaskEnv) -> Iterator[list[Any]]:
        yield from fetch_blocks(env.ctx, [Block(self.node, self.key, self.chunks)],
                                env.fetch_timeout_s)
        if self.consume and self.node == env.ctx.node_id:
            env.ctx.delete(self.key + "/")


@dataclass(frozen=True)
class WriteCache:
    """Compute ``child``, keep it in this worker's store, and pass the items on."""

    child: Spec
    key: str
    cache: int  # the driver's handle on the cache this partition belongs to
    part: int

    def items(self, env: TaskEnv) -> Iterator[Any]:
        data = list(self.child.items(env))
        env.cached.append((self.cache, self.part, store_block(env.ctx, self.key, data)))
        return iter(data)


@dataclass(frozen=True)
class ReadShuffle:
    """One reduce partition: its bucket of every map output, merged."""

    spec: ShuffleSpec
    sides: tuple[tuple[Block, ...], ...]

    def items(self, env: TaskEnv) -> Iterator[Any]:
        streams = [fetch_blocks(env.ctx, blocks, env.fetch_timeout_s) for blocks in self.sides]
        return merge(self.spec, streams)


# ------------------------------------------------------------------------------- sinks
@dataclass(frozen=True)
class WriteShuffle:
    """Map side: bucket the partition and store each non-empty bucket in chunks.
    Reports the chunk count per reduce partition (0: nothing to fetch)."""

    spec: ShuffleSpec
    prefix: str
    map_part: int

    def run(self, env: TaskEnv, items: Iterable[Any]) -> tuple[Any, int]:
        counts, rows = [], 0
        for r, bucket_items in enumerate(bucket(self.spec, items, self.map_part)):
            if not bucket_items:
                counts.append(0)
                continue
            rows += len(bucket_items)
            counts.append(store_block(env.ctx, f"{self.prefix}/{r}", bucket_items))
        return tuple(counts), rows


@dataclass(frozen=True)
class Collect:
    """Return small partitions inline; store big ones here for the driver to fetch."""

    key: str
    inline_items: int
    inline_bytes: int = 1 << 20

    def run(self, env: TaskEnv, items: Iterable[Any]) -> tuple[Any, int]:
        data = list(items)
        # sizes are shallow (sys.getsizeof), enough to keep big items out of the reply
        if len(data) <= self.inline_items and sum(map(sys.getsizeof, data)) <= self.inline_bytes:
            return ("inline", data), len(data)
        return ("stored", store_block(env.ctx, self.key, data)), len(data)


@dataclass(frozen=True)
class CombineByKey:
    """``reduce_by_key_locally``: the partition's pairs combined per key with ``op``, sent
    back in the reply as packed chunks (the driver merges them as partitions finish)."""

    op: Callable[[Any, Any], Any]

    def run(self, env: TaskEnv, items: Iterable[Any]) -> tuple[Any, int]:
        return combined_chunks(items, self.op)


@dataclass(frozen=True)
class Count:
    def run(self, env: TaskEnv, items: Iterable[Any]) -> tuple[Any, int]:
        n = 0
        for n, _ in enumerate(items, 1):
            pass
        return n, n


@dataclass(frozen=True)
class Reduce:
    op: Callable[[Any, Any], Any]

    def run(self, env: TaskEnv, items: Iterable[Any]) -> tuple[Any, int]:
        return reduce_values(items, self.op), 1


@dataclass(frozen=True)
class Fold:
    zero: Any
    op: Callable[[Any, Any], Any]

    def run(self, env: TaskEnv, items: Iterable[Any]) -> tuple[Any, int]:
        acc = self.zero
        op = self.op
        for x in items:
            acc = op(acc, x)
        return acc, 1


@dataclass(frozen=True)
class Take:
    n: int

    def run(self, env: TaskEnv, items: Iterable[Any]) -> tuple[Any, int]:
        data = list(islice(items, self.n))
        return data, len(data)


@dataclass(frozen=True)
class Top:
    n: int
    key: Callable[[Any], Any] | None

    def run(self, env: TaskEnv, items: Iterable[Any]) -> tuple[Any, int]:
        data = heapq.nlargest(self.n, items, key=self.key)
        return data, len(data)


@dataclass(frozen=True)
class Save:
    directory: str
    part: int

    def run(self, env: TaskEnv, items: Iterable[Any]) -> tuple[Any, int]:
        rows, size = io.write_part(items, self.directory, self.part)
        return size, rows


@dataclass(frozen=True)
class SampleKeys:
    """For sort_by: the partition's size and a seeded sample of its sort keys."""

    keyfn: Callable[[Any], Any] | None
    size: int
    seed: int

    def run(self, env: TaskEnv, items: Iterable[Any]) -> tuple[Any, int]:
        data = items if isinstance(items, list) else list(items)
        rng = random.Random(self.seed)
        picked = sorted(rng.sample(range(len(data)), min(self.size, len(data))))
        keyfn = self.keyfn
        keys = [keyfn(data[i]) if keyfn else data[i] for i in picked]
        return (len(data), keys), len(data)


# ------------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class PartitionTask:
    """Compute one partition (``spec``) and feed it to ``sink``, on a worker."""

    stage: str
    part: int
    spec: Spec
    sink: Sink
    fetch_timeout_s: float

    def __repr__(self) -> str:  # short: it names the task in NodeLost and timeout messages
        return f"<map-reduce task: stage '{self.stage}', partition {self.part}>"

    def run(self, ctx: Any) -> TaskOutcome:
        t0 = time.perf_counter()
        env = TaskEnv(ctx, self.fetch_timeout_s)
        tokens = bind_task_context(ctx, self.fetch_timeout_s)
        try:
            value, rows_out = self.sink.run(env, self.spec.items(env))
        finally:
            unbind_task_context(tokens)
        return TaskOutcome(value, env.rows_in, env.bytes_in, rows_out, tuple(env.cached),
                           time.perf_counter() - t0)


@dataclass(frozen=True)
class DeleteTask:
    """Remove every stored key under each prefix; returns how many."""

    prefixes: tuple[str, ...]

    def run(self, ctx: Any) -> int:
        return sum(ctx.delete(p) for p in self.prefixes)


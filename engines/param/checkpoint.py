"""Atomic checkpoints of one server shard: model values, clocks and the worker table.

Format: a numpy ``.npz`` (a zip of ``.npy`` arrays, each member CRC-checked by zip) holding
one array per key plus a ``meta`` member of UTF-8 JSON (format name, version, job, shard, and
per key its clock, type, dtype, shape and sha256). It is read with ``allow_pickle=False``:
loading a checkpoint never runs code. torch tensors are stored as their raw bytes and rebuilt
from the recorded dtype and shape.

Writing goes to a temporary file in the same directory, is fsynced, renamed over the old
checkpoint and the directory fsynced, so a crash leaves either the old or the new checkpoint,
never a mix. Loading checks everything (zip CRCs, digests, job, shard, keys, shapes, dtypes,
and that every step count, clock and count is an int in ``[0, 2**62)``) before returning
anything, so a corrupt, tampered or foreign file is refused whole. The description is
covered by its zip member's CRC, not by a digest: a digest kept in the same file would be
rewritten by whoever edited it, so its fields are checked instead.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from actorpy.errors import ConfigError
from actorpy.values import describe, family
from engines.param.errors import CheckpointError

FORMAT = "actorpy-param-checkpoint"
VERSION = 1
#: A step count, clock or count a checkpoint may hold is below this (no run comes near it;
#: a tampered 1e30 base_step was taken, every worker's steps counted from there)
MAX_COUNT = 2 ** 62


class Malformed(ValueError):
    """A field of a checkpoint's description that a writer of ours never wrote (the
    message says which and what it holds)."""


@dataclass(frozen=True)
class Snapshot:
    """What a checkpoint holds for one shard."""

    values: dict[str, Any]
    clocks: dict[str, int]
    steps: dict[str, int] = field(default_factory=dict)   # worker -> completed steps
    base_step: int = 0                                     # the global step at the save
    updates: int = 0
    pulls: int = 0


class SaveLog:
    """A shard's checkpoint writes, for its log and its stats: the first of a run of failed
    writes is said at ERROR and the rest at DEBUG (a full disk said one line per checkpoint,
    hundreds in a run), the write that ends such a run at INFO.

    >>> saves = SaveLog()
    >>> saves.failed(OSError(28, "No space left on device")), saves.failed(OSError(28, "x"))
    (True, False)
    >>> saves.written(40), saves.stats()
    (2, {'checkpoint_failures': 2, 'checkpoint_error': '[Errno 28] x', 'checkpoint_step': 40})
    """

    def __init__(self) -> None:
        self.failures = 0              # in the whole run
        self.error: str | None = None  # the last failure's
        self.step: int | None = None   # the step of the last checkpoint written
        self._run = 0                  # failures since the last write

    def failed(self, exc: BaseException) -> bool:
        """A write failed; whether it is the first of a run (to be said loudly)."""
        self.failures += 1
        self._run += 1
        self.error = str(exc)
        return self._run == 1

    def written(self, step: int) -> int:
        """A write at ``step`` succeeded; how many failed right before it."""
        run, self._run, self.step = self._run, 0, step
        return run

    def stats(self) -> dict[str, Any]:
        return {"checkpoint_failures": self.failures, "checkpoint_error": self.error,
                "checkpoint_step": self.step}


#: what a run that starts afresh (no resume) renames an earlier run's checkpoint to: one
#: generation kept, where it was overwritten (a crashed run rerun without resume lost it)
EARLIER = ".earlier"


def path_for(directory: str, job: str, shard: int, shards: int) -> str:
    """Where shard ``shard`` of ``shards`` of ``job`` keeps its checkpoint: the job's name
    where it is a safe file name, else its safe form plus a digest of the name itself
    (before, the safe form alone: jobs named ``训练`` and ``测试``, or ``run a`` and
    ``run/a``, shared one file and overwrote each other's checkpoints)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job)
    if safe != job or not safe.strip("."):
        digest = hashlib.sha256(job.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        safe = f"{safe}-{digest}"
    return os.path.join(directory, f"{safe}.shard{shard}of{shards}.npz")


def save(path: str, snapshot: Snapshot, *, job: str, shard: int, shards: int) -> int:
    """Write ``snapshot`` atomically to ``path``; returns the bytes written.

    Raises:
        ConfigError: the directory does not exist or is not writable.
    """
    arrays: dict[str, np.ndarray] = {}
    entries = []
    for i, key in enumerate(sorted(snapshot.values)):
        value = snapshot.values[key]
        raw, fam = _to_numpy(value)
        arrays[f"v{i}"] = raw
        entries.append({"key": key, "clock": int(snapshot.clocks[key]), "family": fam,
                        "dtype": str(value.dtype), "shape": list(value.shape),
                        "sha256": _digest(raw)})
    meta = {"format": FORMAT, "version": VERSION, "job": job, "shard": shard, "shards": shards,
            "keys": entries, "steps": {str(k): int(v) for k, v in snapshot.steps.items()},
            "base_step": int(snapshot.base_step), "updates": int(snapshot.updates),
            "pulls": int(snapshot.pulls)}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ConfigError(f"checkpoint_dir {directory!r} does not exist; create it first")
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    _drop_stale(directory, os.path.basename(path), os.path.basename(tmp))
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return size


def _drop_stale(directory: str, name: str, ours: str) -> None:
    """Remove the temporary files of ``name`` that other processes left (a shard killed while
    it wrote: a model-sized file each, kept for good before). One shard writes ``name``."""
    for entry in os.listdir(directory):
        if entry.startswith(f".{name}.") and entry.endswith(".tmp") and entry != ours:
            try:
                os.unlink(os.path.join(directory, entry))
            except OSError:
                pass


def load(path: str, *, job: str, shard: int, shards: int,
         like: Mapping[str, Any]) -> Snapshot:
    """Read and check the checkpoint at ``path`` against the model ``like`` (key -> a value
    of the right type, shape and dtype, e.g. ``init``).

    Raises:
        CheckpointError: missing, unreadable, corrupt, or written by another job, shard
            layout or model; the message says which and what to do.
    """
    if not os.path.exists(path):
        others = _layouts(path)
        hint = (f"; this job has checkpoints for servers={', '.join(others)}: resume with "
                f"servers={others[0]}" if others else
                "; run once without resume=True (with checkpoint_dir=) to create one")
        missing = CheckpointError(f"no checkpoint at {path}{hint}")
        if not others:   # for a command line to word with its flags
            missing.checkpoint_missing = path
        raise missing
    if not os.path.isfile(path):   # a FIFO's open waits for a writer for ever
        raise CheckpointError(f"checkpoint {path} is not a regular file (a pipe, a device, a "
                              "directory); delete it or resume from another directory")
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(bytes(npz["meta"]).decode("utf-8"))
            _check_meta(meta, path, job, shard, shards)
            arrays = {e["key"]: npz[f"v{i}"] for i, e in enumerate(meta["keys"])}
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile,
            UnicodeDecodeError) as exc:
        # numpy's own words for a pickled file advise loading it unsafely: not for a file
        # that should hold none (and may be anyone's)
        why = ("reading it would need unpickling, which a checkpoint never does"
               if "allow_pickle" in str(exc) else str(exc))
        raise CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint ({why}); "
                              "delete it or resume from another directory") from None
    try:
        return _snapshot(path, meta, arrays, like)
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
        # the format's marker and the job's name, with fields a writer of ours never wrote
        # (a hand-edited or crafted file): refused as a whole, like a corrupt one
        why = str(exc) if isinstance(exc, Malformed) else f"{type(exc).__name__}: {exc}"
        raise CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint (its "
                              f"description is malformed: {why}); "
                              "delete it or resume from another directory") from None


def _count(value: Any, what: str) -> int:
    """``value`` if it is an int (not a bool) in ``[0, MAX_COUNT)``, else Malformed: a
    writer of ours wrote only such, and a float was truncated, a huge one taken."""
    if type(value) is not int or not 0 <= value < MAX_COUNT:
        raise Malformed(f"{what} is {value!r}, not an int in [0, 2**62)")
    return value


def _snapshot(path: str, meta: dict[str, Any], arrays: dict[str, np.ndarray],
              like: Mapping[str, Any]) -> Snapshot:
    """The checked snapshot of a checkpoint whose members were read (``load``)."""
    for e in meta["keys"]:
        if type(e["key"]) is not str:
            raise Malformed(f"a key is {e['key']!r}, not a str")
    entries = {e["key"]: e for e in meta["keys"]}
    clocks = {k: _count(e["clock"], f"the clock of key {k!r}") for k, e in entries.items()}
    steps = {str(k): _count(v, f"the step count of worker {k!r}")
             for k, v in dict(meta["steps"]).items()}
    counts = [_count(meta[name], name) for name in ("base_step", "updates", "pulls")]
    if set(entries) != set(like):
        raise CheckpointError(f"checkpoint {path} holds keys {sorted(entries)}, but this "
                              f"shard's model has {sorted(like)}: it belongs to another model")
    values: dict[str, Any] = {}
    for key, entry in entries.items():
        raw = arrays[key]
        if _digest(raw) != entry["sha256"]:
            raise CheckpointError(f"checkpoint {path}: the data of key {key!r} does not match "
                                  "its digest (the file is corrupt)")
        shape = entry["shape"]
        if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape) or (
                entry["family"] == "numpy" and tuple(shape) != raw.shape):
            raise Malformed(f"the shape of key {key!r} is {shape!r}, not its data's")
        if type(entry["dtype"]) is not str or (entry["family"] == "numpy"
                                               and entry["dtype"] != str(raw.dtype)):
            raise Malformed(f"the dtype of key {key!r} is {entry['dtype']!r}, not its data's")
        value = _from_numpy(raw, entry)
        ref = like[key]
        if family(value) != family(ref) or tuple(value.shape) != tuple(ref.shape) \
                or value.dtype != ref.dtype:
            raise CheckpointError(f"checkpoint {path}: key {key!r} is {describe(value)}, but "
                                  f"the model's is {describe(ref)}: it belongs to another model")
        values[key] = value
    return Snapshot(values, clocks, steps, *counts)


def _layouts(path: str) -> list[str]:
    """Shard counts of other checkpoints of the same job beside ``path``."""
    directory, name = os.path.split(path)
    stem = name.split(".shard", 1)[0]
    try:
        found = os.listdir(directory)
    except OSError:
        return []
    pattern = re.compile(re.escape(stem) + r"\.shard0of(\d+)\.npz$")
    return sorted({m.group(1) for f in found if (m := pattern.match(f))}, key=int)


def _check_meta(meta: Any, path: str, job: str, shard: int, shards: int) -> None:
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an actorpy parameter-server checkpoint")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {meta.get('version')}; "
                              f"this actorpy reads version {VERSION}")
    if meta.get("job") != job:
        raise CheckpointError(f"checkpoint {path} belongs to job {meta.get('job')!r}, not "
                              f"{job!r}")
    if (meta.get("shard"), meta.get("shards")) != (shard, shards):
        raise CheckpointError(f"checkpoint {path} is shard {meta.get('shard')} of "
                              f"{meta.get('shards')}, not {shard} of {shards}: resume with "
                              f"servers={meta.get('shards')}")


def _to_numpy(value: Any) -> tuple[np.ndarray, str]:
    fam = family(value)
    if fam == "numpy":   # not ascontiguousarray, which makes a 0-d array 1-d
        return (value if value.flags.c_contiguous else np.ascontiguousarray(value)), fam
    if fam == "torch":
        import torch

        flat = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        return flat.numpy(), fam
    raise CheckpointError(f"cannot checkpoint {describe(value)}")


def _from_numpy(raw: np.ndarray, entry: Mapping[str, Any]) -> Any:
    if entry["family"] == "numpy":
        return raw
    if entry["family"] != "torch":
        raise CheckpointError(f"unknown value type {entry['family']!r} in a checkpoint")
    import torch

    dtype = getattr(torch, str(entry["dtype"]).replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown torch dtype {entry['dtype']!r} in a checkpoint")
    return torch.from_numpy(raw.copy()).view(dtype).reshape(tuple(entry["shape"]))


def _digest(raw: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(raw).reshape(-1).view(np.uint8)).hexdigest()

"""Serialization: cloudpickle with pickle protocol 5, array data out of band.

numpy arrays and CPU torch tensors never travel inside the pickle stream: their memory is
handed to ZeroMQ as separate frames (no copy on send) and rebuilt on receive straight from the
received frames (no copy, or one copy when a buffer was split into several frames). Everything
else — functions and closures included — goes through cloudpickle.

This is the only module that calls ``loads``. Callers must have authenticated the sender first
(see actorpy.wire.auth): unpickling is code execution.
"""
from __future__ import annotations

import io
import pickle
import struct
import sys
from typing import Any, Sequence

import cloudpickle
import numpy as np

from actorpy.errors import ProtocolError, SerializationError

#: Buffers larger than this are split into frames of this size (the receiver joins them with
#: one copy). Over ipc big frames are best: a frame arrives as one allocation, used in place.
DEFAULT_CHUNK_BYTES = 64 << 20
#: Under CURVE every frame is encrypted as one box; measured here, few-MB frames move 2-3x
#: faster than 64 MB ones, which outweighs the receiver's join copy.
ENCRYPTED_CHUNK_BYTES = 8 << 20
_ALIGN = 16
_ATOMIC = frozenset({type(None), bool, int, float, complex, str, bytes})
_SMALL = 1 << 20


def _rebuild_tensor(flat: np.ndarray, dtype_name: str, shape: tuple[int, ...],
                    requires_grad: bool, is_parameter: bool) -> Any:
    import torch

    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise ProtocolError(f"unknown torch dtype {dtype_name!r}")
    if not flat.flags.writeable:  # torch warns on read-only memory; only tiny arrays get here
        flat = flat.copy()
    tensor = torch.from_numpy(flat).view(dtype).reshape(shape)
    if is_parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


def _reduce_tensor(torch: Any, tensor: Any) -> Any:
    if tensor.layout != torch.strided or tensor.is_quantized or getattr(tensor, "is_nested", False):
        return NotImplemented
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        return NotImplemented
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    # conj() and neg() may be lazy bits on a view; materialise them so the bytes are the value.
    t = t.resolve_conj().resolve_neg().contiguous()
    # One uniform path for every dtype (bfloat16 and float8 have no numpy twin): raw bytes.
    flat = t.reshape(-1).view(torch.uint8).numpy()
    return (_rebuild_tensor, (flat, str(t.dtype).removeprefix("torch."), tuple(t.shape),
                              bool(tensor.requires_grad),
                              isinstance(tensor, torch.nn.Parameter)))


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is np.ndarray:
            if not obj.dtype.hasobject and not (obj.flags.c_contiguous or obj.flags.f_contiguous):
                # numpy pickles non-contiguous arrays in band; send a contiguous copy out of band.
                return np.ascontiguousarray(obj).__reduce_ex__(5)
            return NotImplemented if not obj.dtype.hasobject else super().reducer_override(obj)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return _reduce_tensor(torch, obj)
        return super().reducer_override(obj)


def _describe(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None)
    if name is not None and callable(obj):
        return f"{getattr(obj, '__module__', '?')}.{name}"
    return f"{type(obj).__module__}.{type(obj).__qualname__} object"


def _picklable(obj: Any) -> bool:
    try:
        _Pickler(io.BytesIO(), protocol=5, buffer_callback=lambda b: None).dump(obj)
        return True
    except Exception:
        return False


def _parts(obj: Any) -> list[tuple[str, Any]]:
    """The named pieces pickling ``obj`` pickles in turn (for pointing at a culprit)."""
    code = getattr(obj, "__code__", None)
    if code is not None:  # a Python function: captured variables, globals, defaults
        parts = [(f"captured variable {n!r}", c.cell_contents)
                 for n, c in zip(code.co_freevars, obj.__closure__ or ()) if _filled(c)]
        glob = getattr(obj, "__globals__", {})
        parts += [(f"global {n!r}", glob[n]) for n in code.co_names if n in glob]
        parts += [(f"default argument {i}", d) for i, d in enumerate(obj.__defaults__ or ())]
        return parts
    if isinstance(obj, dict):
        return [(f"[{k!r}]", v) for k, v in list(obj.items())[:100]]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"[{i}]", v) for i, v in enumerate(list(obj)[:100])]
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict) and not isinstance(obj, type):
        return [(f".{k}", v) for k, v in state.items()]
    slots = [n for c in type(obj).__mro__ for n in getattr(c, "__slots__", ())]
    return [(f".{n}", getattr(obj, n)) for n in slots if hasattr(obj, n)]


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


def find_culprit(obj: Any, depth: int = 6) -> str:
    """A path from ``obj`` to the innermost piece that does not pickle, e.g.
    ``.fn -> captured variable 'lock' -> a _thread.lock object``."""
    path: list[str] = []
    for _ in range(depth):
        bad = next(((label, part) for label, part in _parts(obj) if not _picklable(part)), None)
        if bad is None:
            break
        path.append(bad[0])
        obj = bad[1]
    return " -> ".join([*path, _describe(obj)])


def dumps(obj: Any) -> tuple[bytes, list[memoryview]]:
    """Pickle ``obj``; returns the in-band body and the out-of-band buffers (zero-copy views).

    Raises:
        SerializationError: ``obj`` (or something it references) cannot be pickled.
    """
    buffers: list[memoryview] = []
    out = io.BytesIO()

    def keep(buffer: pickle.PickleBuffer) -> None:
        buffers.append(buffer.raw())

    try:
        _Pickler(out, protocol=5, buffer_callback=keep).dump(obj)
    except Exception as exc:  # pickling can raise nearly anything; name the culprit
        raise SerializationError(
            f"cannot serialize {_describe(obj)} for sending: {type(exc).__name__}: {exc}. "
            f"The piece that fails: {find_culprit(obj)}. "
            "Everything a task uses must be picklable (no open files, sockets, locks or "
            "generators); create such things inside the task instead.") from exc
    return out.getbuffer().tobytes(), buffers


def encode(obj: Any, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> tuple[list[Any], bool]:
    """Payload frames for ``obj`` and whether they carry buffers.

    Without buffers the frames are ``[body]``; with them ``[body, layout, chunk...]`` where
    ``layout`` holds, per buffer, the number of chunk frames it was split into (u32 each).
    """
    if type(obj) in _ATOMIC:  # nothing to find out of band, nothing cloudpickle adds
        return [pickle.dumps(obj, protocol=5)], False
    if type(obj) is np.ndarray and not obj.dtype.hasobject:
        # A bare array needs none of cloudpickle's machinery: the C pickler is 3x faster.
        if not (obj.flags.c_contiguous or obj.flags.f_contiguous):
            obj = np.ascontiguousarray(obj)
        raw: list[memoryview] = []
        body = pickle.dumps(obj, protocol=5, buffer_callback=lambda b: raw.append(b.raw()))
        return _with_buffers(body, raw, chunk_bytes)
    body, buffers = dumps(obj)
    if not buffers:
        return [body], False
    return _with_buffers(body, buffers, chunk_bytes)


def _with_buffers(body: bytes, buffers: list[memoryview], chunk_bytes: int) -> tuple[list[Any], bool]:
    counts: list[int] = []
    chunks: list[Any] = []
    for buf in buffers:
        n = max(1, -(-buf.nbytes // chunk_bytes))
        counts.append(n)
        if n == 1:
            chunks.append(buf)
        else:
            chunks.extend(buf[i:i + chunk_bytes] for i in range(0, buf.nbytes, chunk_bytes))
    return [body, struct.pack(f"!{len(counts)}I", *counts), *chunks], True


def _buffer(frame: Any) -> memoryview:
    view = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _aligned(view: memoryview) -> memoryview:
    # ZeroMQ may hand out small messages inside a shared receive buffer at any offset;
    # copy those few so numpy and torch get aligned memory.
    if view.nbytes and view.nbytes < _SMALL:
        address = np.frombuffer(view, dtype=np.uint8).ctypes.data
        if address % _ALIGN:
            return memoryview(bytearray(view))
    return view


def decode(frames: Sequence[Any], has_buffers: bool) -> Any:
    """Rebuild an object from payload frames produced by ``encode``.

    Raises:
        ProtocolError: the frame layout does not add up.
    """
    if not frames:
        raise ProtocolError("payload has no body frame")
    body = _buffer(frames[0])
    buffers: list[memoryview] = []
    if has_buffers:
        if len(frames) < 2:
            raise ProtocolError("buffer layout frame missing")
        layout = _buffer(frames[1])
        if layout.nbytes % 4:
            raise ProtocolError("buffer layout frame has a partial entry")
        counts = struct.unpack(f"!{layout.nbytes // 4}I", layout)
        if any(c < 1 for c in counts) or sum(counts) != len(frames) - 2:
            raise ProtocolError(f"buffer layout {counts} does not match {len(frames) - 2} frames")
        i = 2
        for count in counts:
            if count == 1:
                buffers.append(_aligned(_buffer(frames[i])))
            else:
                parts = [np.frombuffer(_buffer(f), dtype=np.uint8) for f in frames[i:i + count]]
                joined = np.empty(sum(p.nbytes for p in parts), dtype=np.uint8)
                offset = 0
                for part in parts:  # the one copy on receive: numpy's memcpy, no temporaries
                    joined[offset:offset + part.nbytes] = part
                    offset += part.nbytes
                buffers.append(memoryview(joined))
            i += count
    elif len(frames) != 1:
        raise ProtocolError(f"{len(frames)} payload frames but no buffer layout")
    return loads(body, buffers)


def loads(body: Any, buffers: Sequence[memoryview] = ()) -> Any:
    """The one place actorpy unpickles. Only call with data from an authenticated peer."""
    return pickle.loads(body, buffers=buffers)

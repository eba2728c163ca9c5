"""Serialization: cloudpickle with pickle protocol 5, array data out of band.

The memory of numpy arrays and CPU torch tensors larger than ``IN_BAND_MAX_BYTES`` never
travels inside the pickle stream: it is handed to ZeroMQ as separate frames (no copy on send)
and rebuilt on receive straight from the received frames (no copy, or one copy when a buffer
was split into several frames). Smaller ones ride inside the pickle (one copy each way of a
few KB costs less than a frame of their own, which ZeroMQ copies anyway below 64 KB), so a
small message is one frame. Values made only of builtin containers, atoms and numpy arrays
(a training step's tuple of arrays) go through the C pickler; everything else — functions
and closures included — through cloudpickle. A large pickled body is split into frames like
a buffer, sent without a copy and unpickled straight from the frames.

This is the only module that calls ``loads``. Callers must have authenticated the sender first
(see actorpy.wire.auth): unpickling is code execution.
"""
from __future__ import annotations

import io
import pickle
import re
import struct
import sys
import types
from typing import Any, Sequence

import cloudpickle

from actorpy.errors import ProtocolError, SerializationError

#: Buffers and pickled bodies larger than this are split into frames of this size (the
#: receiver joins a split buffer with one copy and unpickles a split body piece by piece).
#: Over ipc big frames are best: a frame arrives as one allocation, used in place.
DEFAULT_CHUNK_BYTES = 64 << 20
#: Under CURVE every frame is encrypted as one box; measured here, few-MB frames move 2-3x
#: faster than 64 MB ones, which outweighs the receiver's join copy.
ENCRYPTED_CHUNK_BYTES = 8 << 20
_ALIGN = 16
_ATOMIC = frozenset({type(None), bool, int, float, complex, str, bytes})
_SMALL = 1 << 20
#: Buffers (array data) up to this size are pickled in band, larger ones out of band.
IN_BAND_MAX_BYTES = 16 << 10
_VIEW_MIN_BYTES = 64 << 10
_NEWLINE = re.compile(b"\n")


class _NoArray:
    """Stands for numpy's ndarray while numpy is not loaded: nothing is one of these."""


def _ndarray() -> type:
    """numpy's ndarray once numpy is loaded. Until then no value can hold an array, so
    there is no need to import it (about 60 ms and, with OpenBLAS, a thread: a driver
    that has not loaded numpy can still fork its local cluster, runtime/launch.py)."""
    return getattr(sys.modules.get("numpy"), "ndarray", _NoArray)


def _rebuild_tensor(flat: Any, dtype_name: str, shape: tuple[int, ...],
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
        if type(obj) is _ndarray():
            if not obj.dtype.hasobject and not (obj.flags.c_contiguous or obj.flags.f_contiguous):
                # numpy pickles non-contiguous arrays in band; send a contiguous copy out of band.
                return obj.copy(order="C").__reduce_ex__(5)
            return NotImplemented if not obj.dtype.hasobject else super().reducer_override(obj)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return _reduce_tensor(torch, obj)
        return super().reducer_override(obj)


class _NotPlain(Exception):
    """The value holds something the plain pickler leaves to cloudpickle."""


class _PlainPickler(pickle.Pickler):
    """The C pickler, for values made only of builtin containers and atoms (which it pickles
    without asking ``reducer_override``) and numpy arrays, dtypes and scalars (numpy's own
    reductions, by reference to numpy, as cloudpickle would). Anything else — a function,
    a class, a tensor, an object of the user's — raises ``_NotPlain`` at once, and the value
    goes through cloudpickle instead."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is _ndarray():
            if obj.dtype.hasobject:
                raise _NotPlain
            if obj.flags.c_contiguous and obj.size and obj.dtype.kind in _SIMPLE_KINDS:
                # numpy's own reduction, with the dtype as its string: pickling the dtype
                # object (a global and its state) took 3 of the 6 us a push of a 4 KB array
                # took to pickle, and rebuilding it 1 of the 3.5 to unpickle. The buffer goes
                # in or out of band and comes back as writable as with numpy's reduction.
                return _array, (pickle.PickleBuffer(obj), obj.dtype.str, obj.shape)
            if not (obj.flags.c_contiguous or obj.flags.f_contiguous):
                return obj.copy(order="C").__reduce_ex__(5)
            return NotImplemented
        if obj is _array:   # by reference, as numpy's own functions
            return NotImplemented
        module = getattr(obj, "__module__", None) if isinstance(obj, (type, _NUMPY_FUNCTIONS)) \
            else type(obj).__module__
        if isinstance(module, str) and (module == "numpy" or module.startswith("numpy.")):
            return NotImplemented
        raise _NotPlain


#: dtype kinds whose ``dtype.str`` names them whole (bool, integers, floats, complex)
_SIMPLE_KINDS = frozenset("biufc")


def _array(buffer: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    """Rebuilds an array ``_PlainPickler`` pickled (as numpy's own ``_frombuffer`` does)."""
    import numpy as np

    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


_NUMPY_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType)
#: values worth trying the plain pickler on (a task, a function... go to cloudpickle at once)
_PLAIN_TOP = frozenset({tuple, list, dict, set, frozenset})


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
    keep = _keeper(buffers)
    if type(obj) in _PLAIN_TOP or type(obj) is _ndarray():
        try:
            _PlainPickler(out, protocol=5, buffer_callback=keep).dump(obj)
            return out.getvalue(), buffers
        except Exception:  # noqa: BLE001 - _NotPlain, or a failure cloudpickle names below
            buffers.clear()
            out = io.BytesIO()
    try:
        _Pickler(out, protocol=5, buffer_callback=keep).dump(obj)
    except Exception as exc:  # pickling can raise nearly anything; name the culprit
        said = str(exc).rstrip()
        raise SerializationError(
            f"cannot serialize {_describe(obj)} for sending: {type(exc).__name__}: {said}"
            f"{'' if said.endswith('.') else '.'} The piece that fails: {find_culprit(obj)}. "
            "Everything a task uses must be picklable (no open files, sockets, locks or "
            "generators); create such things inside the task instead.") from exc
    # getvalue() hands over BytesIO's own buffer (CPython trims it in place): no copy.
    return out.getvalue(), buffers


def _keeper(buffers: list[memoryview]) -> Any:
    """A pickle ``buffer_callback``: a buffer up to ``IN_BAND_MAX_BYTES`` stays in band (a
    true return), a larger one is appended to ``buffers`` and goes out of band."""
    def keep(buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if raw.nbytes <= IN_BAND_MAX_BYTES:
            return True
        buffers.append(raw)
        return False
    return keep


def encode(obj: Any, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> tuple[list[Any], bool]:
    """Payload frames for ``obj`` and whether they start with a layout frame.

    A value without buffers larger than ``IN_BAND_MAX_BYTES`` is one frame, ``[body]``
    (unless the body is larger than ``chunk_bytes``). Otherwise the frames are
    ``[layout, body..., chunk...]``: ``layout`` holds u32 frame counts, first for the pickled
    body, then per out-of-band buffer; every body or buffer larger than ``chunk_bytes`` is
    split into pieces of that size. No frame is a copy: pieces are views of the pickle and of
    the buffers themselves (so ``obj``'s arrays must not change until the frames are sent).
    """
    if type(obj) in _ATOMIC:  # nothing to find out of band, nothing cloudpickle adds
        return _framed(pickle.dumps(obj, protocol=5), [], chunk_bytes)
    if type(obj) is _ndarray() and not obj.dtype.hasobject:
        # A bare array needs no reducer_override at all: the C pickler alone.
        if not (obj.flags.c_contiguous or obj.flags.f_contiguous):
            obj = obj.copy(order="C")
        raw: list[memoryview] = []
        body = pickle.dumps(obj, protocol=5, buffer_callback=_keeper(raw))
        return _framed(body, raw, chunk_bytes)
    body, buffers = dumps(obj)
    return _framed(body, buffers, chunk_bytes)


def _framed(body: bytes, buffers: list[memoryview], chunk_bytes: int) -> tuple[list[Any], bool]:
    if not buffers and len(body) <= chunk_bytes:
        # A big body travels as a view: the node hands views to ZeroMQ without copying.
        return [memoryview(body) if len(body) >= _VIEW_MIN_BYTES else body], False
    counts: list[int] = []
    pieces: list[Any] = []
    for buf in (memoryview(body), *buffers):
        n = max(1, -(-buf.nbytes // chunk_bytes))
        counts.append(n)
        if n == 1:
            pieces.append(buf)
        else:
            pieces.extend(buf[i:i + chunk_bytes] for i in range(0, buf.nbytes, chunk_bytes))
    return [struct.pack(f"!{len(counts)}I", *counts), *pieces], True


def _buffer(frame: Any) -> memoryview:
    view = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _aligned(view: memoryview) -> memoryview:
    # ZeroMQ may hand out small messages inside a shared receive buffer at any offset;
    # copy those few so numpy and torch get aligned memory.
    if view.nbytes and view.nbytes < _SMALL:
        import numpy as np

        address = np.frombuffer(view, dtype=np.uint8).ctypes.data
        if address % _ALIGN:
            return memoryview(bytearray(view))
    return view


def decode(frames: Sequence[Any], has_layout: bool, release: bool = False) -> Any:
    """Rebuild an object from payload frames produced by ``encode``.

    A body split over several frames is unpickled straight from them (no joined copy); a
    buffer split over several frames is joined with one copy. With ``release`` (``frames``
    a list the caller gives up) each piece of a split buffer is dropped from ``frames`` once
    copied, so the received pieces and the joined copy are not all held at once.

    Raises:
        ProtocolError: the frame layout does not add up.
    """
    if not frames:
        raise ProtocolError("payload has no body frame")
    if not has_layout:
        if len(frames) != 1:
            raise ProtocolError(f"{len(frames)} payload frames but no buffer layout")
        return loads(_buffer(frames[0]))
    if len(frames) < 2:
        raise ProtocolError("payload has a layout frame but no body frame")
    layout = _buffer(frames[0])
    if layout.nbytes % 4 or not layout.nbytes:
        raise ProtocolError("buffer layout frame is empty or has a partial entry")
    counts = struct.unpack(f"!{layout.nbytes // 4}I", layout)
    if any(c < 1 for c in counts) or sum(counts) != len(frames) - 1:
        raise ProtocolError(f"buffer layout {counts} does not match {len(frames) - 1} frames")
    body_frames = [_buffer(f) for f in frames[1:1 + counts[0]]]
    buffers: list[memoryview] = []
    i = 1 + counts[0]
    for count in counts[1:]:
        if count == 1:
            buffers.append(_aligned(_buffer(frames[i])))
        else:
            import numpy as np

            pieces = range(i, i + count)
            joined = np.empty(sum(_buffer(frames[j]).nbytes for j in pieces), dtype=np.uint8)
            offset = 0
            for j in pieces:  # the one copy on receive: numpy's memcpy, no temporaries
                part = np.frombuffer(_buffer(frames[j]), dtype=np.uint8)
                joined[offset:offset + part.nbytes] = part
                offset += part.nbytes
                if release:
                    del part
                    frames[j] = None   # type: ignore[index]  # copied: freed now
            buffers.append(memoryview(joined))
        i += count
    if len(body_frames) == 1:
        return loads(body_frames[0], buffers)
    return pickle.Unpickler(_PieceReader(body_frames), buffers=buffers).load()


class _PieceReader:
    """A read-only file over a pickle split into pieces, for ``pickle.Unpickler``.

    Pickle protocol 5 writes 64 KB frames, which the unpickler reads one ``read`` call at a
    time, so the split body is never joined into one big copy."""

    def __init__(self, pieces: list[memoryview]) -> None:
        self._pieces = pieces
        self._index = 0
        self._offset = 0

    def read(self, size: int = -1) -> bytes:
        out: list[memoryview] = []
        want = size if size >= 0 else sum(p.nbytes for p in self._pieces)
        while want > 0 and self._index < len(self._pieces):
            piece = self._pieces[self._index]
            take = piece[self._offset:self._offset + want]
            out.append(take)
            want -= take.nbytes
            self._offset += take.nbytes
            if self._offset >= piece.nbytes:
                self._index += 1
                self._offset = 0
        return out[0].tobytes() if len(out) == 1 else b"".join(out)

    def readinto(self, target: Any) -> int:
        data = self.read(memoryview(target).nbytes)
        memoryview(target).cast("B")[:len(data)] = data
        return len(data)

    def readline(self) -> bytes:
        out: list[bytes] = []
        while self._index < len(self._pieces):
            rest = self._pieces[self._index][self._offset:]
            found = _NEWLINE.search(rest)  # searches the view in place, no copy
            if found is not None:
                out.append(self.read(found.end()))
                break
            out.append(self.read(rest.nbytes))
        return b"".join(out)


class JoinedLists:
    """A list sent as pieces already encoded by ``encode`` (each one a list): the receiver
    unpickles one list, the concatenation. A store sends a block kept in segments this way
    without unpickling or copying them: the pieces' frames travel as out-of-band buffers.

    Args:
        parts: ``(frames, has_layout)`` per piece, as ``encode`` returned them.
    """

    def __init__(self, parts: Sequence[tuple[Sequence[Any], bool]]) -> None:
        self.parts = parts

    def __reduce__(self) -> Any:
        return (_join_lists, (tuple((has_layout, tuple(pickle.PickleBuffer(f) for f in frames))
                                    for frames, has_layout in self.parts),))


def _join_lists(parts: Sequence[tuple[bool, Sequence[Any]]]) -> list[Any]:
    joined: list[Any] = []
    for has_layout, frames in parts:
        piece = decode(list(frames), bool(has_layout))
        if not isinstance(piece, list):
            raise ProtocolError(f"a joined list holds a {type(piece).__name__}, not a list")
        joined.extend(piece)
    return joined


def loads(body: Any, buffers: Sequence[memoryview] = ()) -> Any:
    """The one place actorpy unpickles (with ``decode``, which calls the same unpickler on a
    split body). Only call with data from an authenticated peer."""
    return pickle.loads(body, buffers=buffers)

"""Values on the overlay: bytes, numpy arrays and torch tensors as a descriptor plus one buffer.

A stored value never travels pickled inside a message tuple. The tuple carries a small
*descriptor* ``[kind, dtype, shape]`` and the value's bytes go as a separate buffer, which the
shell sends as its own frame (zero-copy out, ``np.frombuffer`` in). ``parse`` checks a
received descriptor against its buffer before anything is built from it: a known kind, a
dtype from a fixed allow-list (never ``object``), a sane shape, and a byte count that matches.

>>> import numpy as np
>>> blob = Blob.of(np.arange(3, dtype=np.float32))
>>> blob.descriptor(), blob.nbytes
([1, '<f4', [3]], 12)
>>> parse(blob.descriptor(), bytes(blob.data), max_bytes=100).to_value()
array([0., 1., 2.], dtype=float32)
"""
from __future__ import annotations

import math
import sys
from enum import IntEnum
from typing import Any

import numpy as np

from actorpy.errors import ProtocolError

from .ids import MAX_STEP, id_from_bytes, id_to_bytes

MAX_DIMS = 32
#: the most ``(id, step)`` stamps a value carries (``Blob.stamps``)
MAX_STAMPS = 4096


class ValueKind(IntEnum):
    """What a buffer is rebuilt into on receipt."""

    BYTES = 0
    NUMPY = 1
    TORCH = 2


# Fixed-size numeric dtypes only: an object dtype would mean unpickling.
_NUMPY_DTYPES = frozenset(
    f"{order}{code}" for order in "<>" for code in
    ("i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8", "c16")
) | frozenset({"|b1", "|i1", "|u1"})
#: the allowed numpy dtypes, built once (a received value is rebuilt with its dtype)
_NUMPY_DTYPE_OF = {code: np.dtype(code) for code in _NUMPY_DTYPES}
_TORCH_ITEMSIZE = {
    "bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "float16": 2,
    "bfloat16": 2, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16,
}


class Blob:
    """A value ready for the wire: what it is (kind, dtype, shape) and its bytes.

    Args:
        kind: how to rebuild it.
        dtype: numpy ``dtype.str`` for NUMPY, torch dtype name for TORCH, ``"|u1"`` for BYTES.
        shape: the array shape (BYTES: ``(len,)``).
        data: the raw bytes, C order (a zero-copy view where possible).
        stamps: ``(id, step)`` pairs an engine keeps with this version of the value, at most
            ``MAX_STAMPS``, travelling in the descriptor wherever the value goes (stored,
            replicated, handed on, answered). The P2P engine's owners stamp each pusher's
            last step folded into the value, so an owner that takes the key over knows
            which pushes its copy holds already (``owner.py``).
    """

    __slots__ = ("kind", "dtype", "shape", "data", "stamps")

    def __init__(self, kind: ValueKind, dtype: str, shape: tuple[int, ...], data: Any,
                 stamps: tuple[tuple[int, int], ...] = ()) -> None:
        self.kind = kind
        self.dtype = dtype
        self.shape = shape
        view = memoryview(data)
        self.data = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        self.stamps = stamps

    def stamped(self, stamps: tuple[tuple[int, int], ...]) -> Blob:
        """The same value (its buffer shared) with ``stamps`` instead of its own.

        Raises:
            ValueError: more than ``MAX_STAMPS`` stamps.
        """
        if len(stamps) > MAX_STAMPS:
            raise ValueError(f"{len(stamps)} stamps, over the limit of {MAX_STAMPS}")
        return Blob(self.kind, self.dtype, self.shape, self.data, stamps)

    @classmethod
    def of(cls, value: Any) -> Blob:
        """Wrap bytes, a numpy array or a CPU torch tensor (a Blob is returned as is).

        Raises:
            TypeError: anything else (pickle it yourself and store the bytes).
        """
        if isinstance(value, Blob):
            return value
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = memoryview(value).cast("B")
            return cls(ValueKind.BYTES, "|u1", (data.nbytes,), data)
        if isinstance(value, np.ndarray):
            if not _numpy_ok(value):
                raise TypeError(f"cannot store {unstorable(value)}")
            array = np.ascontiguousarray(value)   # a 0-d array comes back 1-d from it:
            return cls(ValueKind.NUMPY, array.dtype.str, tuple(value.shape),   # keep ()
                       array.reshape(-1).view(np.uint8))
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            if not _torch_ok(torch, value):
                raise TypeError(f"cannot store {unstorable(value)}")
            name = str(value.dtype).removeprefix("torch.")
            t = value.detach().cpu().resolve_conj().resolve_neg().contiguous()
            return cls(ValueKind.TORCH, name, tuple(t.shape),
                       t.reshape(-1).view(torch.uint8).numpy())
        raise TypeError(f"cannot store {unstorable(value)}")

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def descriptor(self) -> list[Any]:
        """The plain-values descriptor that stands for this value inside a message:
        ``[kind, dtype, shape]``, and its stamps as ``[[id bytes, step], ...]`` if any."""
        head = [int(self.kind), self.dtype, list(self.shape)]
        if self.stamps:
            head.append([[id_to_bytes(i), n] for i, n in self.stamps])
        return head

    def to_value(self) -> Any:
        """Rebuild the value: bytes, a read-only numpy view of the buffer, or a tensor of its
        own (a copy: torch has no read-only flag). A buffer made in this process (a key's
        owner reading its stored copy) was writeable, and through the view or a tensor on it
        push and pull changed the stored copy in place (not its holders')."""
        if self.kind == ValueKind.BYTES:
            return bytes(self.data)
        if self.kind == ValueKind.NUMPY:
            dtype = _NUMPY_DTYPE_OF.get(self.dtype)
            array = np.frombuffer(self.data, dtype=np.dtype(self.dtype) if dtype is None
                                  else dtype).reshape(self.shape)
            array.setflags(write=False)
            return array
        import torch  # only reached for a tensor, so torch is installed on the sender's side

        # a copy (a received buffer, read-only, was copied before too: torch warns on one)
        flat = np.frombuffer(self.data, dtype=np.uint8).copy()
        return torch.from_numpy(flat).view(getattr(torch, self.dtype)).reshape(self.shape)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Blob):
            return NotImplemented
        return (self.kind, self.dtype, self.shape, self.stamps) == \
            (other.kind, other.dtype, other.shape, other.stamps) and self.data == other.data

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Blob({self.kind.name}, {self.dtype}, {self.shape}, {self.nbytes} bytes)"


def unstorable(value: Any) -> str | None:
    """Why ``Blob.of`` would refuse ``value`` (a dtype off the allow-list, or not bytes, an
    array or a tensor), or None; checks without copying anything.

    >>> unstorable(np.array(["a"])), unstorable(np.zeros(2))
    ('a numpy array of dtype <U1 (numeric dtypes only)', None)
    """
    if isinstance(value, (bytes, bytearray, memoryview, Blob)):
        return None
    if isinstance(value, np.ndarray):
        return (None if _numpy_ok(value)
                else f"a numpy array of dtype {value.dtype} (numeric dtypes only)")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return (None if _torch_ok(torch, value)
                else f"a torch tensor of dtype {value.dtype}, layout {value.layout}")
    return f"a {type(value).__name__} (bytes, numpy arrays and torch tensors only)"


def _numpy_ok(value: np.ndarray) -> bool:
    return value.dtype.str in _NUMPY_DTYPES


def _torch_ok(torch: Any, value: Any) -> bool:
    return (str(value.dtype).removeprefix("torch.") in _TORCH_ITEMSIZE
            and value.layout == torch.strided)


_VALUE_KINDS = tuple(ValueKind)   # by value (0, 1, 2): parse's lookup, not an enum call


def _itemsize(kind: ValueKind, dtype: object) -> int:
    if type(dtype) is not str:
        raise ProtocolError("value dtype must be a str")
    if kind == ValueKind.BYTES and dtype == "|u1":
        return 1
    if kind == ValueKind.NUMPY and dtype in _NUMPY_DTYPES:
        return _NUMPY_DTYPE_OF[dtype].itemsize
    if kind == ValueKind.TORCH and dtype in _TORCH_ITEMSIZE:
        return _TORCH_ITEMSIZE[dtype]
    raise ProtocolError(f"value dtype {dtype[:20]!r} is not allowed for {kind.name}")


def parse(descriptor: object, buffer: object, max_bytes: int) -> Blob:
    """Check a received descriptor against its buffer and wrap them (no copy).

    Args:
        descriptor: ``[kind, dtype, shape]`` or ``[kind, dtype, shape, stamps]`` as found in
            the message.
        buffer: the frame that came with it (bytes, memoryview or anything with the buffer
            protocol).
        max_bytes: the largest value accepted.

    Raises:
        ProtocolError: unknown kind or dtype, bad shape or stamps, size mismatch or over
            ``max_bytes``.

    >>> parse([1, "|O", [1]], b"12345678", 100)
    Traceback (most recent call last):
    ...
    actorpy.errors.ProtocolError: value dtype '|O' is not allowed for NUMPY
    """
    if type(descriptor) not in (list, tuple) \
            or len(descriptor) not in (3, 4):  # type: ignore[arg-type]
        raise ProtocolError("value descriptor must be [kind, dtype, shape(, stamps)]")
    assert isinstance(descriptor, (list, tuple))
    raw_kind, dtype, raw_shape = descriptor[:3]
    stamps = _stamps(descriptor[3]) if len(descriptor) == 4 else ()
    if type(raw_kind) is not int or raw_kind not in (0, 1, 2):
        raise ProtocolError("unknown value kind")
    kind = _VALUE_KINDS[raw_kind]
    itemsize = _itemsize(kind, dtype)
    if type(raw_shape) not in (list, tuple) or len(raw_shape) > MAX_DIMS:
        raise ProtocolError(f"value shape must be a list of at most {MAX_DIMS} sizes")
    for n in raw_shape:
        if type(n) is not int or not 0 <= n <= max_bytes:
            raise ProtocolError("value shape holds a size that is not an int in range")
    shape = tuple(raw_shape)
    if kind == ValueKind.BYTES and len(shape) != 1:
        raise ProtocolError("a bytes value has one dimension")
    try:
        view = memoryview(buffer)  # type: ignore[arg-type]
    except TypeError:
        raise ProtocolError("value buffer is not a buffer") from None
    expected = math.prod(shape) * itemsize
    if expected > max_bytes:
        raise ProtocolError(f"value of {expected} bytes is over the limit of {max_bytes}")
    if view.nbytes != expected:
        raise ProtocolError(f"value buffer holds {view.nbytes} bytes, its descriptor says "
                            f"{expected}")
    return Blob(kind, str(dtype), shape, view, stamps)


def _stamps(raw: object) -> tuple[tuple[int, int], ...]:
    """A received value's stamps: at most ``MAX_STAMPS`` ``[id bytes, step]`` pairs, each id
    once, each step an int in 0 .. 2**63-1."""
    if type(raw) not in (list, tuple) or len(raw) > MAX_STAMPS:  # type: ignore[arg-type]
        raise ProtocolError(f"value stamps must be a list of at most {MAX_STAMPS} pairs")
    stamps: dict[int, int] = {}
    for pair in raw:  # type: ignore[union-attr]
        if type(pair) not in (list, tuple) or len(pair) != 2:
            raise ProtocolError("a value stamp must be [id, step]")
        node_id, step = id_from_bytes(pair[0]), pair[1]
        if type(step) is not int or not 0 <= step <= MAX_STEP or node_id in stamps:
            raise ProtocolError("a value stamp's step is not an int in range, or its id "
                                "comes twice")
        stamps[node_id] = step
    return tuple(stamps.items())

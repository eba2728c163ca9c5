"""A step's arrays on the wire: the small arrays of one dtype packed into one buffer.

A model of many small keys (a torch model has one per parameter tensor) sent as a dict of
arrays paid per array on each side of every message: pickling and unpickling each array
(~2 and ~1.5 us), checking it against the model, averaging it. ``pack`` turns a dict of
values into ``(loose, groups, order)``: every numpy array or CPU-able torch tensor of at most
``PACK_MAX_BYTES``, with at least one other of its family and dtype, is copied into that
dtype's one flat buffer (one memcpy per array, one frame for the lot), and a group is
``(signature, flat)`` with ``signature = (dtype, is_torch, keys, shapes)``. The rest
travels ``loose``, as before: a large array stays zero-copy (its own out-of-band frame),
and anything that is not an array or tensor (which the shard refuses) reaches the shard
as it was sent. A dict with nothing to pack is sent as the plain dict (one key: as before).

``unpack`` gives back the dict, each packed value a view of its group's flat buffer (no
copy), and the groups: the shard checks a group's signature against the model once
(``ServerCore``) and averages a round's flat buffers in one operation per group.
"""
from __future__ import annotations

import itertools
import math
import sys
from typing import Any, Mapping

import numpy as np

#: Arrays up to this size are packed; a larger one is its own frame, never copied.
PACK_MAX_BYTES = 64 << 10
_KINDS = frozenset("biufc")   # bool, integers, floats, complex: flat bytes are the value

Signature = tuple[str, bool, tuple[Any, ...], tuple[tuple[int, ...], ...]]
Group = tuple[Signature, Any]


def pack(values: Mapping[Any, Any] | None) -> Any:
    """``values`` for the wire: the plain dict when nothing is worth packing, else
    ``(loose, groups, order)`` (see the module docstring)."""
    if not values or len(values) < 2:   # nothing to pack together (Job A: one key)
        return values if values is None or type(values) is dict else dict(values)
    torch = sys.modules.get("torch")
    arrays: dict[Any, tuple[list, list]] = {}    # numpy dtype -> (keys, arrays)
    tensors: dict[Any, tuple[list, list]] = {}   # torch dtype -> (keys, tensors)
    for key, value in values.items():
        if type(value) is np.ndarray:   # (by dtype object: no dtype.str made per array)
            group = arrays.get(value.dtype)
            if group is None:
                if value.dtype.kind not in _KINDS:
                    continue
                group = arrays[value.dtype] = ([], [])
            if value.nbytes <= PACK_MAX_BYTES:
                group[0].append(key)
                group[1].append(value)
        elif torch is not None and _packs(value, torch):
            group = tensors.setdefault(value.dtype, ([], []))
            group[0].append(key)
            group[1].append(value)
    members = [*((d, False, m) for d, m in arrays.items()),
               *((d, True, m) for d, m in tensors.items())]
    if not any(len(m[0]) > 1 for _, _, m in members):
        return values if type(values) is dict else dict(values)
    packed: set[Any] = set()
    groups = []
    for dtype, is_torch, (keys, items) in members:
        if len(keys) < 2:
            continue
        if not is_torch:
            # each raveled: one copy, in C; dtype= keeps a byte order not native (">f8")
            flat = np.concatenate(items, axis=None, dtype=dtype)
            flat.setflags(write=False)   # fresh and never changed: sent without a copy
            groups.append(((dtype.str, False, tuple(keys), tuple(v.shape for v in items)),
                           flat))
        else:
            flat = torch.cat([_torch_flat(v) for v in items])
            groups.append(((str(dtype), True, tuple(keys),
                            tuple(tuple(v.shape) for v in items)), flat))
        packed.update(keys)
    loose = {} if len(packed) == len(values) else {k: v for k, v in values.items()
                                                    if k not in packed}
    # the keys' order, when the parts would not give it back (a single group does)
    order = tuple(values) if loose or len(groups) > 1 else None
    return (loose, tuple(groups), order)


def unpack(wire: Any) -> tuple[dict[Any, Any], tuple[Group, ...]]:
    """The dict ``pack`` was given (in its order; packed values as views of their group's
    buffer), and its groups (none for a plain dict)."""
    if type(wire) is not tuple:
        return (wire or {}), ()
    loose, groups, order = wire
    values = dict(loose)
    for (_, _, keys, shapes), flat in groups:
        values.update(zip(keys, views(flat, shapes)))
    if order is not None:
        values = {k: values[k] for k in order}
    return values, groups


def views(flat: Any, shapes: tuple[tuple[int, ...], ...]) -> list[Any]:
    """``flat`` cut into arrays (or tensors) of ``shapes``, each a view (no copy). A run of
    keys of one shape is cut at once (the rows of one reshape: no Python per key)."""
    out: list[Any] = []
    start = 0
    for shape, run in itertools.groupby(shapes):
        count = len(list(run))
        size = math.prod(shape)
        block = flat[start:start + count * size]
        if not shape or block.shape[0] != count * size:   # 0-d: a row would be a scalar
            out.extend(block[i * size:(i + 1) * size].reshape(shape) for i in range(count))
        elif hasattr(block, "unbind"):
            out.extend(block.reshape((count, *shape)).unbind(0))
        else:
            out.extend(block.reshape((count, *shape)))
        start += count * size
    if start != flat.shape[0]:
        raise ValueError(f"a packed buffer of {flat.shape[0]} values holds shapes of {start}")
    return out


def read_only(wire: Any) -> bool:
    """Whether every array of a packed (or plain) dict is a read-only numpy array: safe to
    send uncopied."""
    return all(isinstance(v, np.ndarray) and not v.flags.writeable for v in _arrays(wire))


def largest(wire: Any) -> int:
    """The size in bytes of the largest array of a packed (or plain) dict."""
    return max((int(getattr(v, "nbytes", 0)) for v in _arrays(wire)), default=0)


def _arrays(wire: Any) -> list[Any]:
    """The values a packed (or plain) dict puts on the wire: its loose ones and its groups'
    flat buffers."""
    if type(wire) is not tuple:
        return list((wire or {}).values())
    return [*wire[0].values(), *(flat for _, flat in wire[1])]


def _packs(value: Any, torch: Any) -> bool:
    """Whether a torch value packs: a plain small strided tensor needing no grad."""
    return (type(value) is torch.Tensor and not value.requires_grad
            and value.layout == torch.strided and not value.is_quantized
            and value.element_size() * value.nelement() <= PACK_MAX_BYTES)


def _torch_flat(tensor: Any) -> Any:
    t = tensor.detach()
    if t.device.type != "cpu":   # a CUDA tensor pushed is moved to the CPU, as the wire does
        t = t.cpu()
    return t.resolve_conj().resolve_neg().reshape(-1)

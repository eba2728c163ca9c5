"""How a shard combines the updates buffered for one pull: each key's batch-weighted mean
or sum over the workers' updates (``ShardConfig.aggregate``), packed groups at once.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from actorpy.errors import ConfigError
from actorpy.values import describe, family
from engines.param import packing

#: a buffered update: (slot, worker, updates, batch, packed groups)
Pending = tuple[int, Any, dict[str, Any], int, tuple]


def check_means(init: Mapping[str, Any], aggregate: str) -> None:
    """Refuse, before a job starts, integer and bool keys under ``aggregate="mean"``: a mean
    of two or more integer updates is a float array, which the key cannot take, and a lone
    update passes as it came, so such a job failed with 2 workers and ran with 1 (the
    failure an UpdateError blaming pull's ``set``). Casting the mean back would truncate
    without a word.

    Raises:
        ConfigError: naming the key, its dtype and ``aggregate=``.
    """
    if aggregate != "mean":
        return
    for key, value in init.items():
        fam = family(value)
        dtype = value.dtype
        if (fam == "numpy" and dtype.kind not in "fc") or (
                fam == "torch" and not (dtype.is_floating_point or dtype.is_complex)):
            raise ConfigError(f"init[{key!r}] is {describe(value)}, and aggregate='mean' (the "
                              "default) averages the workers' updates, which turns integers "
                              "into floats the key cannot hold: use Job(..., aggregate='sum') "
                              "(or 'each') for integer and bool keys, or make the key float")


def combine(pending: list[Pending], aggregate: str) -> dict[str, Any]:
    """Each key's sum (``aggregate="sum"``), or batch-weighted mean, over ``pending``,
    keys sorted. A key with one update is passed as received (no copy); a mean
    accumulates in place on a fresh array (one temporary per further update). When every
    update packed the same groups (``packing``), each group's flat buffers are combined at
    once (the same operations on each value, so the same result) and every key gets a
    view of that."""
    combined: dict[str, Any] = {}
    if len(pending) == 1:
        updates = pending[0][2]
        return {key: updates[key] for key in sorted(updates)}
    first = pending[0][4]
    same = bool(first) and all(len(p[4]) == len(first) and all(
        a[0] == b[0] for a, b in zip(p[4], first)) for p in pending[1:])
    # Overflow is not reported here: pull gets the inf or nan and its own code decides
    # (numpy's warning, from this line on a shard's node, was nothing a user could act on).
    with np.errstate(over="ignore", invalid="ignore"):
        for i, (sig, _) in enumerate(first if same else ()):
            flat = _parts([(p[4][i][1], p[3]) for p in pending], aggregate)
            combined.update(zip(sig[2], packing.views(flat, sig[3])))
        for key in sorted({k for p in pending for k in p[2]}.difference(combined)):
            combined[key] = _parts([(p[2][key], p[3]) for p in pending if key in p[2]],
                                   aggregate)
    return {key: combined[key] for key in sorted(combined)} if same else combined


def _parts(parts: list[tuple[Any, int]], aggregate: str) -> Any:
    if len(parts) == 1:
        return parts[0][0]
    if aggregate == "sum":
        acc = parts[0][0] + parts[1][0]
        for value, _ in parts[2:]:
            acc += value
    else:
        acc = _mean(parts)
    # a 0-d key's updates combine to a numpy scalar: pull gets the 0-d array, as it gets a
    # lone update (and as the key's packed updates combine)
    return np.asarray(acc) if isinstance(acc, np.generic) else acc


def _mean(parts: list[tuple[Any, int]]) -> Any:
    """``Σ b_i u_i / Σ b_i`` (equal weights if no batch is positive), the same operations in
    the same order as ``actorpy.barrier.weighted_average``, but accumulated in place: the
    first product is a fresh array, so adding to it changes nothing anyone holds."""
    weights = [b for _, b in parts]
    if sum(weights) <= 0:
        weights = [1] * len(parts)
    total = sum(w for w in weights if w > 0)
    terms = [(u, w / total) for (u, _), w in zip(parts, weights) if w > 0]
    acc = terms[0][0] * terms[0][1]
    for u, c in terms[1:]:
        acc = _add_scaled(acc, u, c)
    return acc


#: elements per block of a large array's ``acc += u * c`` (512 kB of float64 products)
_BLOCK = 1 << 16


def _add_scaled(acc: Any, u: Any, c: float) -> Any:
    """``acc += u * c`` (``acc`` may be a numpy scalar: the sum is returned); for large
    numpy arrays block by block, so that the products are not one more model-sized array
    (the same operations on each element: the same result)."""
    if (type(acc) is np.ndarray and type(u) is np.ndarray and acc.size > _BLOCK
            and acc.shape == u.shape and acc.flags.c_contiguous and u.flags.c_contiguous):
        a, b = acc.reshape(-1), u.reshape(-1)
        for i in range(0, a.size, _BLOCK):
            a[i:i + _BLOCK] += b[i:i + _BLOCK] * c
        return acc
    acc += u * c
    return acc

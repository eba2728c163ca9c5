"""How a shard combines the updates buffered for one pull: each key's batch-weighted mean
or sum over the workers' updates (``ShardConfig.aggregate``), packed groups at once.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from engines.param import packing

#: a buffered update: (slot, worker, updates, batch, packed groups)
Pending = tuple[int, Any, dict[str, Any], int, tuple]


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
        return acc
    return _mean(parts)


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
        acc += u * c
    return acc

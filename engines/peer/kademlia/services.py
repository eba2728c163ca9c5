"""Overlay services' arithmetic: network-size estimates and the sampling depth.

Size (papers.md, Kademlia): with ``u_k`` the normalised XOR distance from a point to its k-th
closest node, ``n ~ (k-1)/u_k`` (unbiased: ``u_k`` is Gamma(k, n) distributed; relative error
about ``1/sqrt(k-2)`` per estimate, so average several nodes' estimates when it matters).

Sampling (``sampling.py``) draws from subtrees of ids sharing ``sample_depth`` bits.
"""
from __future__ import annotations

import math
from typing import Sequence

from .ids import ID_BITS
from .routing import Contact, RoutingTable


def table_size_estimate(table: RoutingTable) -> float:
    """Network size (this node counted) from id density around our own id.

    After the join lookup a node knows its k closest peers, so ``(k-1)/u_k`` with the target
    being our own id (``u_k``: normalised distance to the k-th closest contact) estimates the
    other nodes; with fewer than k contacts we take the table as the whole network. (Pooling
    non-full buckets under-counts here: a far bucket may have room yet miss nodes it never met.)

    >>> from .ids import KadId
    >>> t = RoutingTable(KadId(0), ksize=4)
    >>> for i in range(1, 9): _ = t.observe(Contact(KadId(i << 150), str(i)), now=0.0)
    >>> table_size_estimate(t)  # the 4th closest is at 4/1024 of the space: 1 + 3 / (4/1024)
    769.0
    """
    k = table.ksize
    closest = table.closest(table.own_id, k)
    estimate = lookup_size_estimate(table.own_id, closest, k)
    return 1.0 + (estimate if estimate is not None else len(closest))


def lookup_size_estimate(target: int, closest: Sequence[Contact], ksize: int) -> float | None:
    """``(k-1)/u_k`` from the k closest nodes a lookup found for a random ``target``; None when
    it found fewer than ``ksize`` (then the lookup saw the whole network: use ``len + 1``).

    >>> from .ids import KadId
    >>> cs = [Contact(KadId(i << 150), str(i)) for i in range(1, 5)]
    >>> lookup_size_estimate(0, cs, 4) == 3 / (4 / 1024)
    True
    """
    if len(closest) < ksize or ksize < 2:
        return None
    u_k = (closest[ksize - 1].node_id ^ target) / float(1 << ID_BITS)
    return (ksize - 1) / u_k if u_k > 0 else None


def sample_depth(size_estimate: float, ksize: int) -> int:
    """Subtree depth whose expected population is about ``0.6 * ksize``, so a lookup of k
    nodes nearly always holds the whole subtree.

    >>> sample_depth(1000, 20), sample_depth(10, 20)
    (6, 0)
    """
    if size_estimate <= 0.6 * ksize:
        return 0
    return max(0, int(math.log2(size_estimate / (0.6 * ksize))))

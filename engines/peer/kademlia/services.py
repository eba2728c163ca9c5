"""Overlay services' arithmetic: network-size estimates and unbiased peer sampling.

Size (papers.md, Kademlia): with ``u_k`` the normalised XOR distance from a point to its k-th
closest node, ``n ~ (k-1)/u_k`` (unbiased: ``u_k`` is Gamma(k, n) distributed; relative error
about ``1/sqrt(k-2)`` per estimate, so average several nodes' estimates when it matters).

Sampling: the node closest to a random id is *not* a uniform sample: its chance is the size of
its XOR cell, which varies by orders of magnitude with the gaps between ids. Instead we take the
whole subtree of ids sharing ``depth`` bits with a random target (a lookup returns it complete
while it holds fewer than k nodes) and accept each of its nodes independently with a fixed
probability. Every node is then returned with probability ``2**-depth / spread`` per try:
uniform, whatever the gaps (``depth`` only tunes how many nodes one try yields). Picks of one
try are id-space neighbours; ids are random, so that does not correlate with anything a
barrier cares about (speed, load).
"""
from __future__ import annotations

import math
import random
from typing import Sequence

from .ids import ID_BITS, shared_prefix_len
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


def picks_from_subtree(target: int, depth: int, found: Sequence[Contact], ksize: int,
                       rng: random.Random, spread: int = 4) -> list[Contact]:
    """One sampling try (see the module docstring): the accepted members of a whole subtree.

    Each node of the complete subtree around ``target`` at ``depth`` is accepted on its own
    with probability ``1/spread``. If the lookup could not see that whole subtree (k nodes all
    inside it), we use the half holding ``target`` and double the probability, which keeps
    every node's chance per try at ``2**-depth / spread`` exactly while ``2**extra <= spread``.

    Args:
        target: the uniformly random id looked up.
        depth: the subtree depth (from ``sample_depth``); all tries of a sample share it.
        found: the lookup's result for ``target``, closest first (up to ``ksize`` contacts).
        ksize: the lookup's k.
        rng: the sampler's injected rng.
        spread: inverse acceptance probability at ``depth``; larger spreads the picks over
            more tries (less clustered in id space) at the cost of more lookups.

    >>> from .ids import KadId
    >>> cs = [Contact(KadId(i), str(i)) for i in range(3)]
    >>> [c.address for c in picks_from_subtree(0, 0, cs, 4, random.Random(1), spread=1)]
    ['0', '1', '2']
    """
    complete = len(found) < ksize
    d = depth
    while True:
        sub = [c for c in found if shared_prefix_len(c.node_id, target) >= d]
        if complete or len(sub) < len(found) or d >= ID_BITS:
            break
        d += 1  # the depth-d subtree may hold more than we saw: use a half of it
    accept = min(1.0, 2.0 ** (d - depth) / spread)
    return [c for c in sub if rng.random() < accept]

"""Sections of `actorpy demo` that use the engines (registered as ``actorpy.demo`` entry
points in pyproject.toml, so the core's CLI finds them without importing engines)."""
from __future__ import annotations

import random

from engines.peer.kademlia.ids import key_id
from engines.peer.kademlia.sim import SimNetwork


def overlay(nodes: int = 500) -> None:
    """A simulated Kademlia overlay keeps a key through the death of a quarter of its nodes."""
    print(f"\nKademlia overlay, simulated: {nodes} nodes join, a key is stored, "
          "a quarter of the nodes die")
    net = SimNetwork(seed=1)
    first, *others = net.grow(nodes)
    key = key_id(b"model/w")
    stored = net.set(first, key, b"v1")
    reader = others[-1]
    net.kill_fraction(0.25, random.Random(2), keep=frozenset({reader}))
    found = net.get(reader, key)
    print(f"  stored on {len(stored.stored_on)} nodes; found again: {found.value!r} in "
          f"{found.rounds} rounds, {found.rpcs} RPCs")
    print(f"  network size as one node estimates it: {net.nodes[reader].size_estimate():.0f} "
          f"(true: {len(net.alive)})")


def main(argv: list[str] | None = None) -> int:
    overlay()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

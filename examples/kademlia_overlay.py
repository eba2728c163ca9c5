"""A simulated Kademlia overlay: 400 nodes, a stored key, a quarter of the nodes killed,
the key still found; plus the overlay's network-size estimate and a peer sample for PSP.

    python examples/kademlia_overlay.py
"""
import random

from engines.peer.kademlia.ids import key_id
from engines.peer.kademlia.sim import SimNetwork


def main() -> None:
    net = SimNetwork(seed=3)
    # each join is a lookup through the simulated network, in Python: ~10 s of CPU
    print("growing a simulated overlay of 400 nodes ...", flush=True)
    nodes = net.grow(400)
    key = key_id(b"model/layer1")
    stored = net.set(nodes[0], key, b"weights-v1")
    print(f"stored on {len(stored.stored_on)} nodes in {stored.rounds} rounds")
    reader = nodes[-1]
    net.kill_fraction(0.25, random.Random(4), keep=frozenset({reader}))
    found = net.get(reader, key)
    print(f"after 25% of nodes died: {found.value!r} in {found.rounds} rounds, "
          f"{found.elapsed_s * 1000:.0f} ms of simulated time")
    print(f"size estimate seen from {reader}: {net.nodes[reader].size_estimate():.0f}")
    sample = net.sample_peers(reader, 8, random.Random(5))
    print("8 random peers for a PSP barrier:", [c.address for c in sample])


if __name__ == "__main__":
    main()

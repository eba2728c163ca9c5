"""Kademlia overlay on the simulated network: lookup rounds, RPCs, success under failures,
simulated latency, and the simulator's own wall time.

Run: ``python bench/kademlia_sim.py [--sizes 100 400 1600] [--lookups 200] [--seed 0]``

Baselines in the same run, printed as ratios: the theoretical ``log2(N)`` rounds, and a naive
lookup with one request in flight (``alpha = 1``) on the same overlay and the same targets.
Latency is virtual: one-way latency uniform in 5-50 ms, RPC timeout 2 s.
"""
from __future__ import annotations

import argparse
import math
import random
import time

from engines.peer.kademlia.events import Done, KademliaConfig
from engines.peer.kademlia.ids import key_id
from engines.peer.kademlia.sim import SimNetwork


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def build(n: int, alpha: int, failed: float, seed: int) -> tuple[SimNetwork, dict[int, bytes]]:
    """An overlay of ``n`` nodes holding 50 keys, with ``failed`` of its nodes then killed.
    The same seed gives the same ids, joins, keys and victims whatever ``alpha`` is."""
    config = KademliaConfig(alpha=alpha, refresh_on_join=False, refresh_interval_s=1e9,
                            republish_interval_s=1e9)
    net = SimNetwork(config, seed=seed)
    live = net.grow(n)
    rng = random.Random(seed + 1)
    keys = {key_id(f"key{i}"): f"value{i}".encode() for i in range(50)}
    for key, value in keys.items():
        net.set(rng.choice(live), key, value)
    if failed:
        net.kill_fraction(failed, rng)
    return net, keys


def run_gets(net: SimNetwork, keys: dict[int, bytes], count: int, seed: int) -> list[Done]:
    """``count`` FIND_VALUE lookups of stored keys, each from a live node not holding it."""
    rng = random.Random(seed)
    live = sorted(net.alive)
    key_list = sorted(keys)
    done = []
    while len(done) < count:
        source, key = rng.choice(live), rng.choice(key_list)
        if net.nodes[source].storage.get(key, net.clock.now()) is None:
            done.append(net.get(source, key))
    return done


def summarize(done: list[Done], keys: dict[int, bytes]) -> dict[str, float]:
    rounds = [d.rounds for d in done]
    latency = [d.elapsed_s for d in done]
    return {
        "rounds": sum(rounds) / len(rounds), "p95r": pct(rounds, 0.95),
        "rpcs": sum(d.rpcs for d in done) / len(done),
        "ok": sum(d.value == keys[d.target] for d in done) / len(done),
        "lat": sum(latency) / len(latency), "p95lat": pct(latency, 0.95),
    }


def bench(n: int, lookups: int, seed: int) -> list[str]:
    rows = []
    for failed in (0.0, 0.25):
        started = time.perf_counter()
        net, keys = build(n, 3, failed, seed)
        ours = summarize(run_gets(net, keys, lookups, seed + 2), keys)
        wall = time.perf_counter() - started
        naive_net, _ = build(n, 1, failed, seed)
        naive = summarize(run_gets(naive_net, keys, lookups, seed + 2), keys)
        rows.append(
            f"{n:>5} {failed:>5.0%} {ours['rounds']:>6.2f} {ours['p95r']:>4.0f} "
            f"{ours['rounds'] / math.log2(n):>6.2f} {ours['rpcs']:>6.1f} {ours['ok']:>6.1%} "
            f"{ours['lat'] * 1e3:>7.0f} {ours['p95lat'] * 1e3:>7.0f} "
            f"{naive['lat'] / ours['lat']:>7.2f} {naive['ok']:>7.1%} "
            f"{wall:>7.1f} {net.delivered:>9}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 400, 1600])
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print("FIND_VALUE of stored keys from live non-holders (k=20, alpha=3, 50 keys);")
    print("baselines: rounds/log2(N); 'naive x' = mean latency of alpha=1 lookups on the")
    print("identically seeded overlay, as a multiple of ours. wall s: build + set + gets (ours)")
    print(f"{'N':>5} {'fail':>5} {'rounds':>6} {'p95':>4} {'/log2N':>6} {'RPCs':>6} "
          f"{'ok':>6} {'lat ms':>7} {'p95 ms':>7} {'naive x':>7} {'naiveok':>7} "
          f"{'wall s':>7} {'messages':>9}")
    for n in args.sizes:
        for line in bench(n, args.lookups, args.seed):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

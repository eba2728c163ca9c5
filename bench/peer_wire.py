"""P2P engine benchmark over the real wire: peers as core services on an embedded cluster.

Run: ``python bench/peer_wire.py [--workers 2] [--peers 64] [--lookups 200] [--steps 300]
[--target 0.01]``

1. Lookups: ``--peers`` peers (``PeerService``, several per worker) joined into one overlay,
   20 keys stored; FIND_VALUE of those keys from random peers (as the simulated bench),
   latency on the asking peer's clock (median, p95) and rounds, and FIND_NODE of random
   ids (which must hear from, or time out on, all k closest); then 25 % of the peers stopped at once (their services
   vanish without a goodbye, as a crash would look to the overlay), 1 s for replica checks,
   the lookups again, and every key read back (lost: no live copy).
2. Training: ``actorpy p2p-sgd``'s problem (the SGD app's linear regression, 100 features)
   on ``--train-peers`` peers under pBSP, pSSP, BSP, ASP, beside the PS engine's ASP and BSP
   (``actorpy sgd``) with as many workers: seconds for ``--steps`` steps per worker/peer
   (or, with ``--target E``, until the weight error is under E), and the final error. Same data generation, lr and batch in every row.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import numpy as np

import actorpy
from apps import p2p_sgd, sgd
from apps.training import parse_barrier
from engines.peer.cluster_run import start_peers
from engines.peer.kademlia.events import KademliaConfig
from engines.peer.shell import PeerKind

CALL_S = 30.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lookup_rows(cluster: Any, peers: int, count: int, seed: int) -> list[str]:
    config = KademliaConfig(rpc_timeout_s=0.25, replica_check_s=0.5, replication=3,
                            refresh_on_join=False)
    rng = random.Random(seed)
    refs, _ = start_peers(cluster, peers, config, seed, name="bench")
    live = list(range(peers))
    rows = []
    try:
        keys = [f"key-{i}" for i in range(20)]
        for i, name in enumerate(keys):
            cluster.call(refs[i % peers], PeerKind.SET, (name, np.full(8, i, np.float32)),
                         timeout_s=CALL_S)
        for dead_pct in (0, 25):
            if dead_pct:
                doomed = rng.sample(live, peers * dead_pct // 100)
                for i in doomed:
                    cluster.stop_service(refs[i])
                live = [i for i in live if i not in doomed]
                time.sleep(1.0)                 # replica checks notice the dead holders
            started = time.monotonic()
            times, rounds, failed, node_times = [], [], 0, []
            for _ in range(count):
                found, hops, seconds = cluster.call(
                    refs[rng.choice(live)], PeerKind.LOOKUP, rng.choice(keys),
                    timeout_s=CALL_S)
                failed += not found
                times.append(seconds)
                rounds.append(hops)
            for _ in range(max(1, count // 4)):
                _, _, seconds = cluster.call(refs[rng.choice(live)], PeerKind.FIND,
                                             rng.getrandbits(160), timeout_s=CALL_S)
                node_times.append(seconds)
            lost = sum(cluster.call(refs[live[0]], PeerKind.GET, name, timeout_s=CALL_S)
                       is None for name in keys)
            rows.append(f"{peers:>5} {dead_pct:>4}% {statistics.median(times) * 1e3:>9.2f} "
                        f"{pct(times, 0.95) * 1e3:>9.2f} {statistics.mean(rounds):>6.2f} "
                        f"{failed:>7} {lost:>5} {statistics.median(node_times) * 1e3:>9.2f} "
                        f"{pct(node_times, 0.95) * 1e3:>9.2f} "
                        f"{time.monotonic() - started:>7.1f}")
    finally:
        for i in live:
            cluster.stop_service(refs[i])
    return rows


def sgd_rows(cluster: Any, peers: int, steps: int, seed: int,
             target: float | None) -> list[str]:
    rows = []
    common = ["--steps", str(steps), "--seed", str(seed)]
    if target is not None:
        common += ["--target", str(target)]
    for spec in ("pbsp:2", "pssp:2:4", "bsp", "asp"):
        name, *nums = spec.split(":")
        extra = (["--sample", nums[0]] if nums else []) + (["--staleness", nums[1]]
                                                           if len(nums) > 1 else [])
        args = p2p_sgd.parse(["--peers", str(peers), "--barrier", name, *extra, *common])
        result, _ = p2p_sgd.train(cluster, args, parse_barrier(spec))
        rows.append(_row(f"P2P {spec}", result))
    for spec in ("asp", "bsp"):
        args = sgd.build_parser().parse_args(["--barrier", spec, *common])
        args.lr, args.decay = 0.1, None
        result, _ = sgd.train(cluster, args, parse_barrier(spec))
        rows.append(_row(f"PS {spec}", result))
    return rows


def _row(label: str, r: dict[str, Any]) -> str:
    return (f"{label:>14} {r['seconds']:>8.2f} {r['weight_error']:>9.4f} {r['updates']:>7} "
            f"{min(r['steps_per_worker']):>6}-{max(r['steps_per_worker'])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--peers", type=int, default=64)
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--train-peers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--target", type=float, default=None,
                        help="stop at this weight error (time to target) instead of after "
                             "--steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with actorpy.connect(workers=args.workers, task_threads=2) as cluster:
        print(f"1. FIND_VALUE of stored keys among {args.peers} peers on {args.workers} "
              "workers (real wire, timeout 250 ms, 2 misses evict), 20 keys, replication 3; "
              "node med/p95: FIND_NODE of random ids (ms)")
        print(f"{'N':>5} {'dead':>5} {'median ms':>9} {'p95 ms':>9} {'rounds':>6} "
              f"{'failed':>7} {'lost':>5} {'node med':>9} {'node p95':>9} {'wall s':>7}")
        for line in lookup_rows(cluster, args.peers, args.lookups, args.seed):
            print(line, flush=True)
        print(f"\n2. linear regression (d=100, batch 32, lr 0.1), {args.steps} steps per "
              f"peer/worker: {args.train_peers} P2P peers vs the PS engine on "
              f"{args.workers} workers")
        print(f"{'run':>14} {'seconds':>8} {'w error':>9} {'updates':>7} {'steps':>10}")
        if args.target is not None:
            print(f"   (stopping at weight error {args.target}, at most {args.steps} steps)")
        for line in sgd_rows(cluster, args.train_peers, args.steps, args.seed, args.target):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

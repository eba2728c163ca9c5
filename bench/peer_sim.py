"""P2P engine benchmark, simulated part: overlay lookups and P2P SGD under each barrier.

Run: ``python bench/peer_sim.py [--peers 64] [--lookups 200] [--train-peers 16] [--seed 0]``

Everything here runs on ``SimNetwork`` (virtual time, one process): the same sans-I/O peers a
real shell drives, with a cluster-like network (one-way latency 0.1-0.5 ms, 100 ms RPC
timeout). Times are virtual seconds. The real-wire benchmark (peers as core services, beside
the PS engine) is ``bench/peer.py``.

1. Lookups: FIND_VALUE of stored keys among ``--peers`` peers with 0 % and 25 % of them
   killed at once, then 1 s for the overlay to notice (replica checks every 0.5 s) before the
   lookups: median and p95 latency, rounds, failed lookups, keys lost (no live copy left).
   The lookups still meet dead peers in routing tables that nobody has asked about yet.
2. Training: linear regression (the PS engine's Job A problem: d = 32, known w*, batch 32,
   lr 0.005) on ``--train-peers`` peers, each step 1 ms of compute, until the relative weight
   error is under 1 %. pBSP, pSSP, BSP, SSP, ASP; then the same with one peer 3x slower.
   The error is probed from the owner's copy every 0.5 ms (outside the protocol).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import numpy as np

from actorpy.barrier import ASP, BSP, PSP, SSP, Policy
from engines.peer import Job, OwnerStore, PeerContext, SimRun
from engines.peer.kademlia.events import KademliaConfig
from engines.peer.kademlia.ids import key_id
from engines.peer.kademlia.sim import SimNetwork

LAN = (0.0001, 0.0005)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lookups(peers: int, count: int, seed: int) -> list[str]:
    rows = []
    for failed in (0.0, 0.25):
        started = time.perf_counter()
        config = KademliaConfig(replication=3, rpc_timeout_s=0.1, replica_check_s=0.5,
                                refresh_on_join=False, refresh_interval_s=1e9,
                                republish_interval_s=1e9)
        net = SimNetwork(config, seed=seed, latency_s=LAN)
        live = net.grow(peers)
        rng = random.Random(seed + 1)
        keys = {key_id(f"key{i}"): f"value{i}".encode() for i in range(50)}
        for key, value in keys.items():
            net.set(rng.choice(live), key, value)
        if failed:
            net.kill_fraction(failed, rng)
            net.run_for(1.0)        # replica checks notice the dead, holders store again
        survivors = sorted(net.alive)
        lost = sum(1 for key in keys if not any(
            net.nodes[a].storage.get(key, net.clock.now()) for a in survivors))
        done = []
        while len(done) < count:
            source, key = rng.choice(survivors), rng.choice(sorted(keys))
            if net.nodes[source].storage.get(key, net.clock.now()) is None:
                done.append(net.get(source, key))
        latency = [d.elapsed_s * 1e3 for d in done]
        failed_lookups = sum(d.value != keys[d.target] for d in done)
        rows.append(f"{peers:>5} {failed:>5.0%} {statistics.median(latency):>9.2f} "
                    f"{pct(latency, 0.95):>9.2f} {statistics.mean(d.rounds for d in done):>6.2f} "
                    f"{failed_lookups:>7} {lost:>5} {time.perf_counter() - started:>7.1f}")
    return rows


D, ROWS, BATCH, LR, TARGET = 32, 2000, 32, 0.005, 0.01
W_STAR = np.random.default_rng(0).normal(size=D)


def shard(index: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + index)
    x = rng.normal(size=(ROWS, D))
    return x, x @ W_STAR + 0.01 * rng.normal(size=ROWS)


def train(policy: Policy, peers: int, straggler: bool, seed: int) -> dict[str, Any]:
    """Time (virtual) until the model on the overlay is within TARGET of w*."""
    hit: dict[str, float] = {}
    job = Job("linreg", barrier=policy, seed=seed)
    job.register_schedule(lambda ctx: ["w"])

    @job.register_push
    def push(ctx: PeerContext, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x, y = ctx.data
        rows = ctx.rng.integers(0, ROWS, BATCH)
        return {"w": x[rows].T @ (x[rows] @ values["w"] - y[rows]) / BATCH}

    @job.register_pull
    def pull(store: OwnerStore, updates: dict[str, np.ndarray]) -> None:
        w, _ = store.get("w")
        store.set("w", w - LR * updates["w"])

    job.register_stop(lambda ctx: "at" in hit or ctx.step >= 5000)
    compute = lambda index, step: 0.003 if straggler and index == 0 else 0.001  # noqa: E731
    run = SimRun(job, peers, {"w": np.zeros(D)}, data=shard, compute_s=compute, latency_s=LAN,
                 max_s=600.0)

    def probe() -> None:
        owner = run.net.true_closest(key_id("w"), 1)[0].address
        record = run.net.nodes[owner].storage.get(key_id("w"), run.net.clock.now())
        if record is not None and "at" not in hit:
            w = record.value.to_value()
            if np.linalg.norm(w - W_STAR) / np.linalg.norm(W_STAR) < TARGET:
                hit["at"] = run.net.clock.now() - begin   # from the job's start, not the joins
                return
        run.net.clock.call_later(0.0005, probe)

    begin = run.net.clock.now()
    run.net.clock.call_later(0.0, probe)
    started = time.perf_counter()
    result = run.run()
    steps = list(result.steps.values())
    return {"t": hit.get("at", float("nan")), "mean_steps": statistics.mean(steps),
            "slow_steps": result.steps[run.order[0]], "updates": result.updates,
            "messages": result.messages, "wall": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=64)
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--train-peers", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"1. FIND_VALUE among {args.peers} simulated peers (one-way 0.1-0.5 ms, timeout "
          "100 ms, 2 misses evict), 50 keys, replication 3, 1 s after the kills")
    print(f"{'N':>5} {'dead':>5} {'median ms':>9} {'p95 ms':>9} {'rounds':>6} {'failed':>7} "
          f"{'lost':>5} {'wall s':>7}")
    for line in lookups(args.peers, args.lookups, args.seed):
        print(line, flush=True)
    n = args.train_peers
    print(f"\n2. P2P SGD, linear regression d={D} on {n} simulated peers, 1 ms compute per "
          f"step, to {TARGET:.0%} weight error (virtual seconds)")
    print(f"{'barrier':>14} {'straggler':>9} {'to target':>9} {'steps':>6} {'slow':>5} "
          f"{'updates':>7} {'messages':>8} {'wall s':>7}")
    policies = [("pBSP(4)", PSP(4, 0)), ("pSSP(4,2)", PSP(4, 2)), ("BSP", BSP()),
                ("SSP(2)", SSP(2)), ("ASP", ASP())]
    for straggler in (False, True):
        for name, policy in policies:
            r = train(policy, n, straggler, args.seed)
            print(f"{name:>14} {'3x' if straggler else '-':>9} {r['t']:>9.3f} "
                  f"{r['mean_steps']:>6.1f} {r['slow_steps']:>5} {r['updates']:>7} "
                  f"{r['messages']:>8} {r['wall']:>7.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""P2P engine benchmark over the real wire, beside the PS engine, in one run.

Run: ``python bench/peer.py``  (Job A at 20 000 x 1000; ``--full``: the issue's 100 000 x 1000)

1. Lookups: ``--peers`` peers (``PeerService``s, spread over ``--lookup-workers`` worker
   processes, 16 by default: 4 peers each) joined into one overlay, 20 keys stored
   (replication 3, replica checks every 0.5 s); FIND_VALUE of those keys from random live
   peers, latency on the asking peer's clock (median, p95) and rounds, and FIND_NODE of
   random ids (which must hear from, or time out on, all k closest). Then churn: a quarter
   of the processes are SIGKILLed one after the other (25 % of the peers, in waves of 4,
   mid-overlay, no goodbye); after each kill the driver polls the holders until every key
   is back on its 3 closest live peers (the repair time, printed under the table; at most
   30 s), then kills the next. Then the lookups again, and every key read back (lost: no
   live copy; doomed: keys whose every copy, their 3 closest peers' and their writer's own,
   died in one wave, which no overlay could keep: in waves of 4 about one run in 550 dooms
   a key, where the same 16 peers killed at once, ``--lookup-workers 4``, doom 0.34 % of
   keys, a key in one run of 16).
2. Job A (``bench/ps.py``'s problem: linear regression on ROWS x FEATURES float32 with known
   w*, plain SGD, lr 0.002, minibatch 256 per worker or peer, stop at |w - w*| / |w*| < 0.05)
   on 2 workers: the PS engine's ASP and BSP (one server shard on one of the workers), and the
   P2P engine under pBSP, pSSP (PSP(1, 4) by default, as bench/ps.py's), LB-pSSP (the same
   with balance=True: a peer the others press against takes fewer samples), BSP and ASP. A P2P
   peer stops once the w its last push returned is within the target. Then the same with
   worker / peer 2 three times slower (it sleeps twice its compute time each step). Seconds
   from the start (every worker / peer ready) to the target; each row's runs with and
   without the straggler alternate ``--repeat`` times, medians reported. One table per
   ``--peers-a`` count (default 2 then 4): with 2 peers, one per worker as the PS job's
   workers, pSSP's sample is always the other peer (PSP(1, s) is SSP(s) there, paced by
   the straggler like BSP); with 4, two per worker, it samples 1 of 3, and the table adds
   pSSP with ``durable=False`` (a push acknowledged once applied, no replication round to
   wait for: with 2 peers the answer is the pusher's copy, so there is none anyway). Every
   table has pSSP with ``overlap=False`` too (each step waits for its pushes' answers; by
   default a step computes while the last step's pushes travel), and with ``overlap=4``
   (up to 4 steps compute while a push travels, their updates then sent as one push).

Targets (printed, never asserted): lookup median < 5 ms and p95 < 1 s with 25 % dead, no
failed lookup, no lost key; P2P pSSP within 1.5x the PS engine's ASP; under the straggler,
pSSP loses less than half of what BSP loses.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Benchmark the checkout this script lives in, not whatever actorpy is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cloudpickle  # noqa: E402
import numpy as np  # noqa: E402

import actorpy  # noqa: E402
from actorpy.barrier import ASP, BSP, PSP, Policy  # noqa: E402
from engines import peer  # noqa: E402
from engines.peer.cluster_run import start_peers  # noqa: E402
from engines.peer.kademlia.events import KademliaConfig  # noqa: E402
from engines.peer.kademlia.ids import key_id  # noqa: E402
from engines.peer.shell import PeerKind  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine  # noqa: E402
import ps  # noqa: E402  (the PS benchmark's Job A: problem, callbacks, runner)

cloudpickle.register_pickle_by_value(ps)   # its callbacks travel to the workers by value
CALL_S = 30.0
PSSP = "P2P pSSP"      # the row the targets compare (staleness 4, as bench/ps.py's pSSP)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------ 1. lookups
REPAIR_S = 30.0     # a wave's keys must be back on `replication` live holders by then
POLL_S = 0.05       # how often the driver asks the holders while it waits for that


def closest_live(infos: list[tuple[int, str]], live: list[int], name: str,
                 n: int) -> list[int]:
    """The ``n`` live peers (indexes into ``infos``) closest to key ``name`` by XOR: the
    holders the overlay must keep it on."""
    kid = key_id(name)
    return sorted(live, key=lambda i: infos[i][0] ^ kid)[:n]


def held_keys(cluster: Any, refs: list[Any], asked: list[int]) -> dict[int, set[int]]:
    """Peer index -> the key ids it holds (its ``STATUS``), for each of ``asked``."""
    return {i: set(cluster.call(refs[i], PeerKind.STATUS, timeout_s=CALL_S)["keys"])
            for i in asked}


def wait_repaired(cluster: Any, refs: list[Any], infos: list[tuple[int, str]],
                  live: list[int], names: list[str], copies: int,
                  since: float) -> tuple[float, list[str]]:
    """Poll until each of ``names`` is held by its ``copies`` closest live peers, or
    ``REPAIR_S`` after ``since``; returns the seconds from ``since`` and the names still
    short of holders then."""
    want = {name: closest_live(infos, live, name, copies) for name in names}
    asked = sorted({i for holders in want.values() for i in holders})
    while True:
        held = held_keys(cluster, refs, asked)
        missing = [name for name in names
                   if any(key_id(name) not in held[i] for i in want[name])]
        seconds = time.monotonic() - since
        if not missing or seconds > REPAIR_S:
            return seconds, missing
        time.sleep(POLL_S)


def false_timeouts(cluster: Any, refs: list[Any], live: list[int]) -> str:
    """What the live peers' requests timed out on so far, while no peer was dead: every
    timeout a live peer's (an adaptive timeout shorter than a stalled process)."""
    status = [cluster.call(refs[i], PeerKind.STATUS, timeout_s=CALL_S) for i in live]
    rpcs = sum(s.get("rpcs", 0) for s in status)
    timeouts = sum(s.get("timeouts", 0) for s in status)
    late = sum(s.get("late_replies", 0) + s.get("late", 0) for s in status)
    return (f"before the kills: {timeouts} of {rpcs} requests timed out on a live peer "
            f"({100 * timeouts / max(1, rpcs):.2f} %), {late} answers came late")


def lookup_rows(peers: int, workers: int, count: int, seed: int,
                min_timeout_s: float | None = None) -> list[str]:
    """Lookups among ``peers`` on ``workers`` processes, then again after a quarter of the
    processes were SIGKILLed, one per wave, each wave's keys repaired before the next (the
    last lines: the repairs, and the timeouts on live peers before the kills)."""
    floor = {} if min_timeout_s is None else {"min_rpc_timeout_s": min_timeout_s}
    config = KademliaConfig(rpc_timeout_s=0.25, replica_check_s=0.5, replication=3,
                            refresh_on_join=False, **floor)  # type: ignore[arg-type]
    rng = random.Random(seed)
    rows = []
    with actorpy.connect(workers=workers, task_threads=2) as cluster:
        refs, infos = start_peers(cluster, peers, config, seed, name="bench")
        live = list(range(peers))
        keys = [f"key-{i}" for i in range(20)]
        for i, name in enumerate(keys):
            cluster.call(refs[i % peers], PeerKind.SET, (name, np.full(8, i, np.float32)),
                         timeout_s=CALL_S)
        _, missing = wait_repaired(cluster, refs, infos, live, keys, config.replication,
                                   time.monotonic())
        if missing:
            raise RuntimeError(f"keys {missing} never reached their {config.replication} "
                               "closest peers")
        pids = {r["node_id"]: r["pid"] for r in cluster.nodes()}
        # peer 0 (the bootstrap, and the peer every key is read back from) lives on [0]
        waves = rng.sample(cluster.workers()[1:], max(1, workers // 4))
        repairs: list[float] = []
        doomed: list[str] = []          # every copy died in one wave: none to repair from
        unrepaired: list[str] = []      # short of live holders REPAIR_S after its wave
        for dead in (False, True):
            if dead:
                false = false_timeouts(cluster, refs, live)
            for victim in waves if dead else ():
                dying = {i for i in live if refs[i].node == victim}
                # every copy, the 3 closest peers' and any other (its writer keeps one)
                held = held_keys(cluster, refs, live)
                doomed += [n for n in keys if n not in doomed and
                           {i for i in live if key_id(n) in held[i]} <= dying]
                killed = time.monotonic()
                os.kill(pids[victim], signal.SIGKILL)
                live = [i for i in live if i not in dying]
                seconds, missing = wait_repaired(
                    cluster, refs, infos, live,
                    [n for n in keys if n not in doomed + unrepaired],
                    config.replication, killed)
                repairs.append(seconds)
                unrepaired += missing
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
            rows.append(f"{peers:>5} {100 - 100 * len(live) // peers:>4}% "
                        f"{statistics.median(times) * 1e3:>9.2f} "
                        f"{pct(times, 0.95) * 1e3:>9.2f} {statistics.mean(rounds):>6.2f} "
                        f"{failed:>7} {lost:>5} {len(doomed):>6} "
                        f"{statistics.median(node_times) * 1e3:>9.2f} "
                        f"{pct(node_times, 0.95) * 1e3:>9.2f} "
                        f"{time.monotonic() - started:>7.1f}")
        plural = "s" * (len(waves) > 1)
        rows.append(f"repair after each of {len(waves)} wave{plural} of {peers // workers} "
                    f"peers: median {statistics.median(repairs):.2f} s, max "
                    f"{max(repairs):.2f} s ({' '.join(f'{s:.2f}' for s in repairs)})"
                    + (f"; not back within {REPAIR_S:g} s: {', '.join(unrepaired)}"
                       if unrepaired else ""))
        rows.append(false)
    return rows


# ------------------------------------------------------------------ 2. Job A, P2P side
class PeerHalf:
    """``data(index)``: peer ``index`` holds worker ``index % 2``'s rows of ``bench/ps.py``."""

    def __init__(self, seed: int, rows: int, features: int) -> None:
        self.seed, self.rows, self.features = seed, rows, features

    def __call__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return ps.half(self.seed, index % 2, self.rows // 2, self.features)


class PeerPush:
    """``bench/ps.py``'s ``Push`` for a peer (peer 1 sleeps twice its compute when
    ``straggle``); it remembers the error of the w it was handed, for ``PeerStop``."""

    def __init__(self, seed: int, features: int, straggle: bool,
                 slack_ns: int = ps.ps_problem.STRAGGLER_SLACK_NS) -> None:
        self.ws, self.straggle, self.slack_ns = ps.w_star(seed, features), straggle, slack_ns
        self.error = float("inf")

    def __call__(self, ctx: peer.PeerContext, values: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        x, y = ctx.data
        w = values["w"]
        self.error = ps.error(w, self.ws)
        i = ctx.rng.integers(0, len(y), ctx.batch_size)
        g = ps.gradient(w, x[i], y[i])
        if self.straggle and ctx.index == 1:
            ps.straggler_wait(t0, self.slack_ns)
        return {"w": g}


class PeerStop:
    """Stop once the w this peer last read is within the target (``push``: the same peer's
    ``PeerPush``; shipped together they stay one object)."""

    def __init__(self, push: PeerPush, target: float) -> None:
        self.push, self.target = push, target

    def __call__(self, ctx: peer.PeerContext) -> bool:
        return self.push.error < self.target


def p2p_job_a(cluster: Any, args: argparse.Namespace, barrier: Policy, straggle: bool,
              peers: int | None = None, durable: bool = True,
              balance: bool = False,
              overlap: bool | int = True) -> tuple[float, int, float, list[int], int]:
    """Job A on ``peers`` P2P peers: (seconds to target, updates, final error, steps per
    peer, the index of the peer that folded the most updates: the key's owner)."""
    job = peer.Job("bench-a", barrier=barrier, seed=args.seed, rpc_timeout_s=0.5,
                   durable=durable, batch=args.batch, balance=balance, overlap=overlap)
    job.register_schedule(lambda ctx: ["w"])
    push = PeerPush(args.seed, args.features, straggle, args.straggler_slack_ns)
    job.register_push(push)
    job.register_pull(ps.Pull(args.lr))
    job.register_stop(PeerStop(push, args.target))
    result = job.run(cluster, peers=peers or args.peers_a[0],
                     init={"w": np.zeros(args.features, dtype=np.float32)},
                     data=PeerHalf(args.seed, args.rows, args.features),
                     timeout_s=args.timeout)
    err = ps.error(result.model["w"], ps.w_star(args.seed, args.features))
    applied = list(result.applied.values())
    return (result.seconds, result.updates, err, list(result.steps.values()),
            applied.index(max(applied)))


Row = tuple[float, int, float, str, bool]   # seconds, updates, error, steps, peer 2 owned w


APPLIED = "P2P pSSP, acks on apply"   # durable=False (more than 2 peers only)
BALANCED = "P2P LB-pSSP"              # pSSP with balance=True: a straggler's batch shrinks
WAITING = "P2P pSSP, no overlap"      # overlap=False: a step waits for its pushes' answers
DEEPER = "P2P pSSP, overlap=4"        # 4 steps may compute while a push travels (the bound)


def job_a_rows(args: argparse.Namespace, peers: int) -> dict[tuple[str, bool], float]:
    """Each run's times with and without the straggler, alternating ``--repeat`` times;
    the medians are printed (a shared machine's load drifts less between the two sides)."""
    ps_runs = [("PS ASP", ASP()), ("PS BSP", BSP())]
    beta = min(args.sample, peers - 1)
    p2p_runs = [(f"P2P pBSP({beta})", PSP(beta, 0)), (PSSP, PSP(beta, 4)),
                (DEEPER, PSP(beta, 4)), (WAITING, PSP(beta, 4)), (BALANCED, PSP(beta, 4)),
                ("P2P BSP", BSP()),
                ("P2P ASP", ASP())]
    if peers > 2:   # with 2, a push's answer is the pusher's copy: no round to wait for
        p2p_runs.insert(2, (APPLIED, PSP(beta, 4)))
    rows: dict[tuple[str, bool], list[Row]] = {}
    with actorpy.connect(workers=2, task_threads=2) as cluster:
        for name, barrier in ps_runs + p2p_runs:
            for _ in range(args.repeat):
                for straggle in (False, True):
                    if name.startswith("PS"):
                        seconds, updates, err, _ = ps.actorpy_job_a(cluster, args, barrier,
                                                                    straggle)
                        steps, owner = "", -1
                    else:
                        seconds, updates, err, per_peer, owner = p2p_job_a(
                            cluster, args, barrier, straggle, peers, durable=name != APPLIED,
                            balance=name == BALANCED,
                            overlap={WAITING: False, DEEPER: 4}.get(name, True))
                        steps = f"{min(per_peer)}-{max(per_peer)}"
                    rows.setdefault((name, straggle), []).append(
                        (seconds, updates, err, steps, owner == 1))
    times: dict[tuple[str, bool], float] = {}
    for straggle in (False, True):
        print(("\n  peer / worker 2 three times slower" if straggle else "\n  no straggler")
              + f"; medians of {args.repeat} alternating runs")
        # "p2 owns": in how many runs peer 2 (the straggler's slot) owned the key, so that
        # the other peer's pushes waited in its inbox while it computed (docs/peer.md)
        print(f"  {'run':<23} {'to target':>9} {'updates':>8} {'ms/update':>9} "
              f"{'error':>7} {'steps':>11} {'p2 owns':>7}")
        for name, _ in ps_runs + p2p_runs:
            runs = sorted(rows[(name, straggle)])
            seconds, updates, err, steps, _ = runs[len(runs) // 2]
            owned = "" if name.startswith("PS") else f"{sum(r[4] for r in runs)}/{len(runs)}"
            times[(name, straggle)] = seconds
            extra = (f"  loses {100 * (seconds / times[(name, False)] - 1):+.0f} %"
                     if straggle else "")
            print(f"  {name:<23} {seconds:>8.2f}s {updates:>8} "
                  f"{1e3 * seconds / max(updates, 1):>9.3f} {err:>7.4f} {steps:>11} "
                  f"{owned:>7}{extra}")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=64, help="lookup part (default 64)")
    parser.add_argument("--lookup-workers", type=int, default=16,
                        help="worker processes for the lookup part; a quarter of them are "
                             "killed, one per wave (default 16; 4: 16 of 64 peers at once)")
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--min-timeout-ms", type=float, default=None,
                        help="the lookup part's min_rpc_timeout_s, in ms (default: the "
                             "KademliaConfig default)")
    parser.add_argument("--full", action="store_true",
                        help="Job A at the issue's size, 100 000 x 1000 (default 20 000 rows)")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--features", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--target", type=float, default=0.05)
    parser.add_argument("--straggler-slack-ns", type=int, default=ps.ps_problem.STRAGGLER_SLACK_NS,
                        help="the straggler's timer slack, so that its sleep ends on time "
                        "(ps_problem.straggler_wait; 0: the OS default, 50 us on Linux)")
    parser.add_argument("--peers-a", type=lambda s: [int(n) for n in s.split(",")],
                        default=[2, 4],
                        help="P2P peers for Job A, one table each (default 2,4: one peer per "
                             "worker as the PS job's workers, then two)")
    parser.add_argument("--sample", type=int, default=1,
                        help="peers pBSP and pSSP sample (default 1, as bench/ps.py's pSSP; "
                             "at most peers - 1)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="Job A runs per row and side, alternating; medians (default 3)")
    parser.add_argument("--skip-lookups", action="store_true")
    parser.add_argument("--only-lookups", action="store_true", help="the lookup part alone")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.rows is None:
        args.rows = 100_000 if args.full else 20_000
    print(f"P2P engine over the real wire; {os.cpu_count()} cores")
    watch = machine.CpuWatch()      # the machine's steal and load, printed after each part
    if not args.skip_lookups:
        print(f"\n1. FIND_VALUE of stored keys among {args.peers} peers on "
              f"{args.lookup_workers} worker processes (timeout 250 ms, 2 misses evict), "
              f"20 keys, replication 3; then {max(1, args.lookup_workers // 4)} processes "
              "SIGKILLed one at a time, each wave's keys repaired (back on their 3 closest "
              "live peers) before the next; node "
              "med/p95: FIND_NODE of random ids (ms); doomed: keys whose every copy died in "
              "one wave (no overlay keeps those: lost should equal it, and lookups of them "
              "fail)")
        print(f"{'N':>5} {'dead':>5} {'median ms':>9} {'p95 ms':>9} {'rounds':>6} "
              f"{'failed':>7} {'lost':>5} {'doomed':>6} {'node med':>9} {'node p95':>9} "
              f"{'wall s':>7}")
        floor = None if args.min_timeout_ms is None else args.min_timeout_ms / 1e3
        for line in lookup_rows(args.peers, args.lookup_workers, args.lookups, args.seed,
                                floor):
            print(line, flush=True)
        print(watch.summary())
    for part, peers in enumerate([] if args.only_lookups else args.peers_a):
        print(f"\n2{'abcdefgh'[part]}. Job A: {args.rows} x {args.features} float32, lr "
              f"{args.lr}, batch {args.batch} per worker / peer, target |w-w*|/|w*| < "
              f"{args.target}; 2 workers; P2P: {peers} peers, no server; pBSP/pSSP sample "
              f"{min(args.sample, peers - 1)}")
        print(ps.straggler_line(args))
        times = job_a_rows(args, peers)
        loss = {n: times[(n, True)] - times[(n, False)]
                for n in (PSSP, DEEPER, BALANCED, "P2P BSP")}
        print()
        for name in (PSSP, DEEPER):
            ratio = times[(name, False)] / times[("PS ASP", False)]
            print(f"  {peers} peers: {name} / PS ASP time to target: {ratio:.2f} "
                  "(target <= 1.5)")
        for name in (PSSP, DEEPER, BALANCED):
            share = (f" ({loss[name] / loss['P2P BSP']:.2f} of it)" if loss["P2P BSP"] > 0
                     else "")
            print(f"  {peers} peers: straggler costs {name} {loss[name]:+.2f} s, P2P BSP "
                  f"{loss['P2P BSP']:+.2f} s{share} (target: pSSP's <= half of BSP's)",
                  flush=True)
        print(f"  {watch.summary()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

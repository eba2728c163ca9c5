"""Transport benchmark: raw pyzmq vs actorpy's wire vs the full Node runtime, side by side.

Run:  python bench/transport.py [--quick] [--rounds R] [--mech ipc,curve]

What it measures, per mechanism (``ipc``: sockets in ``auth.private_dir()``; ``curve``: CurveZMQ
over tcp://127.0.0.1 with both sides holding the same cluster secret and the server running the
ZAP authenticator from ``Security.start_authenticator``) and per payload (a tiny message, numpy
float32 arrays of 1 KB .. 128 MB, a 16 MB torch tensor):

* (a) ``raw``  — pyzmq DEALER -> ROUTER, the array sent as one raw frame (``copy=False`` from
  64 KB up, the same threshold actorpy uses; below it pyzmq's copying send is the faster one),
  received with ``copy=False`` and turned into an ndarray with ``np.frombuffer`` (a tensor with
  ``torch.from_numpy``). This is the floor: no header, no pickle, dtype/shape known in advance.
* (b) ``wire`` — the same sockets, but every message is built with
  ``actorpy.wire.message.assemble`` (header + ``serde.encode``), checked with
  ``Security.is_trusted``, parsed with ``Message.parse`` and decoded with ``.payload()`` into a
  real ndarray / tensor — exactly the work a Node does per message, minus its threads.
* (c) ``node`` — two ``actorpy.runtime.node.Node``s: ``node.call`` round trips to a handler that
  answers with ``node.reply(msg, value)``, and ``node.send`` streams closed by a ``call``; this
  is what a request costs end to end (I/O thread hand-offs, futures, handler dispatch).

Round-trip latency: the client (this process) sends a message and waits for the echo; the
server echoes what it decoded (wire/node re-encode it). ``perf_counter`` around each round
trip, after a warm-up; median and p99 over all round trips.

One-way bandwidth: the client sends K messages back to back; the server decodes every one and
then answers one small ack. Bandwidth = K * size / (time from the first send to the ack),
after one untimed warm-up repetition; the median over several repetitions is printed.

The server runs in a separate process (``multiprocessing`` spawn context) so the two sides
never share a GIL; commands travel over a multiprocessing Pipe, data only over ZeroMQ.
``np.copyto`` between two preallocated arrays of each size is the physical limit (memcpy).
Nothing here asserts on speed; the targets (b/a >= 0.8 in bandwidth from 1 MB up, small
round trip of the wire <= 1.5x raw) are printed next to the table.

Last, a row of Python objects (bench/transport_objects.py): ~50 MB of pickled (str, int)
tuples process to process, time and peak RSS of both ends, Node against pickle + raw pyzmq.

This file drives the runs and prints the tables; the three implementations (their codecs,
the server process and the clients) are in bench/transport_impls.py.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Benchmark the checkout this script lives in, not whatever actorpy is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import zmq  # noqa: E402

from actorpy.wire import auth  # noqa: E402
from actorpy.wire.kinds import Kind  # noqa: E402
from transport_impls import (CLIENT_ID, NodeClient, SocketClient,  # noqa: E402
                             raw_decode, raw_frames, security_for, server_main, wire_decode,
                             wire_frames)
from transport_objects import objects_row  # noqa: E402  (bench/ is this script's directory)

SMALL = "tiny msg"


@dataclass(frozen=True)
class Payload:
    label: str
    nbytes: int          # 0: the tiny message (8 raw bytes / a small Python int)
    torch: bool = False
    rtt_n: int = 0       # round trips timed
    bw_k: int = 0        # messages per bandwidth repetition
    bw_reps: int = 0     # timed bandwidth repetitions


def payloads(quick: bool) -> list[Payload]:
    q = (lambda full, short: short) if quick else (lambda full, short: full)
    kb, mb = 1 << 10, 1 << 20
    return [
        Payload(SMALL, 0, rtt_n=q(3000, 500)),
        Payload("1 KB", kb, rtt_n=q(2000, 300), bw_k=q(4000, 1000), bw_reps=q(5, 3)),
        Payload("64 KB", 64 * kb, rtt_n=q(1000, 200), bw_k=q(500, 200), bw_reps=q(5, 3)),
        Payload("1 MB", mb, rtt_n=q(200, 50), bw_k=q(64, 32), bw_reps=q(5, 3)),
        Payload("16 MB", 16 * mb, rtt_n=q(20, 5), bw_k=q(8, 4), bw_reps=q(5, 3)),
        Payload("128 MB", 128 * mb, rtt_n=q(3, 1), bw_k=q(2, 1), bw_reps=q(3, 1)),
        Payload("torch 16 MB", 16 * mb, torch=True, rtt_n=q(20, 5), bw_k=q(8, 4),
                bw_reps=q(5, 3)),
    ]


def make_value(p: Payload) -> Any:
    """What the client sends: the thing a user would hand to the wire."""
    if p.nbytes == 0:
        return 42
    arr = np.arange(p.nbytes // 4, dtype=np.float32)
    if p.torch:
        import torch
        return torch.from_numpy(arr)
    return arr


def payload_kind(p: Payload) -> str:
    return "small" if p.nbytes == 0 else ("torch" if p.torch else "numpy")


def stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return statistics.median(ordered), p99


def cpu_per_message(quick: bool) -> None:
    """Python CPU per message, encode + decode, raw vs wire, timed in this one process.

    Unlike the socket rows this does not depend on the scheduler of a noisy 2-core machine:
    it is the work the wire adds to each message, to set beside the round-trip times.
    """
    import timeit

    security = auth.Security.ipc()
    print("CPU per message in one process (encode + parse + decode; median of 5 runs)")
    print(f"{'payload':<12} {'raw us':>8} {'wire us':>8} {'added us':>9}")
    for p in payloads(quick):
        if p.nbytes > (1 << 20):
            continue  # large payloads are bound by copying, covered by the bandwidth rows
        value, kind = make_value(p), payload_kind(p)

        def raw() -> None:
            raw_decode([zmq.Frame(f) for f in raw_frames(value)], kind)

        def wire() -> None:
            frames = [zmq.Frame(f) for f in wire_frames(value, CLIENT_ID, Kind.RESULT, security, 1)]
            wire_decode(frames, security, has_identity=False)
        n = 2000 if p.nbytes < (1 << 16) else 300
        t_raw = statistics.median(timeit.repeat(raw, number=n, repeat=5)) / n * 1e6
        t_wire = statistics.median(timeit.repeat(wire, number=n, repeat=5)) / n * 1e6
        print(f"{p.label:<12} {t_raw:>8.1f} {t_wire:>8.1f} {t_wire - t_raw:>9.1f}")
    # A parameter-server step as the param engine sends it: (step, {key: update}, batch,
    # seconds) with a 4 KB float32 update; raw moves the array alone.
    grad = np.ones(1000, dtype=np.float32)
    step = (7, {"w": grad}, 256, 0.001)

    def raw_step() -> None:
        raw_decode([zmq.Frame(f) for f in raw_frames(grad)], "numpy")

    def wire_step() -> None:
        frames = [zmq.Frame(f) for f in wire_frames(step, CLIENT_ID, Kind.RESULT, security, 1)]
        wire_decode(frames, security, has_identity=False)
    t_raw = statistics.median(timeit.repeat(raw_step, number=2000, repeat=5)) / 2000 * 1e6
    t_wire = statistics.median(timeit.repeat(wire_step, number=2000, repeat=5)) / 2000 * 1e6
    print(f"{'PS step 4KB':<12} {t_raw:>8.1f} {t_wire:>8.1f} {t_wire - t_raw:>9.1f}")
    print()


def memcpy_bw(nbytes: int, reps: int = 5) -> float:
    src = np.ones(max(1, nbytes // 4), dtype=np.float32)
    dst = np.empty_like(src)
    inner = max(1, (64 << 20) // max(src.nbytes, 1))
    np.copyto(dst, src)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            np.copyto(dst, src)
        times.append((time.perf_counter() - t0) / inner)
    return src.nbytes / statistics.median(times)


def run_mechanism(mech: str, quick: bool, results: dict, rounds: int = 1) -> None:
    ctx = mp.get_context("spawn")
    ipc_dir = auth.private_dir("actorpy-bench-")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=server_main, args=(child, mech, ipc_dir), daemon=True)
    server.start()
    security = security_for(mech)
    try:
        # Within every round and for every payload, raw, wire and node run back to back, so
        # the drift of a noisy machine hits all three alike; samples are pooled over rounds,
        # bandwidths take the median round.
        samples: dict[tuple[str, str], list[float]] = {}
        bandwidths: dict[tuple[str, str], list[float]] = {}
        for round_no in range(rounds):
            for p in payloads(quick):
                value, kind = make_value(p), payload_kind(p)
                for impl in ("raw", "wire", "node"):
                    client: Any = (NodeClient(parent, mech, ipc_dir, security) if impl == "node"
                                   else SocketClient(parent, mech, impl, security))
                    try:
                        samples.setdefault((p.label, impl), []).extend(
                            client.rtt(value, kind, p.rtt_n))
                        if p.bw_k:
                            t = statistics.median(
                                client.bandwidth(value, kind, p.bw_k, p.bw_reps))
                            bandwidths.setdefault((p.label, impl), []).append(
                                p.bw_k * max(p.nbytes, 1) / t)
                    finally:
                        client.close()
                print(f"  {mech:5s} {p.label:12s} round {round_no + 1} done", file=sys.stderr,
                      flush=True)
        for (label, impl), values in samples.items():
            results.setdefault((mech, label), {})[f"rtt_{impl}"] = stats(values)
        for (label, impl), values in bandwidths.items():
            results[(mech, label)][f"bw_{impl}"] = statistics.median(values)
    finally:
        parent.send(("stop",))
        server.join(timeout=30)
        if server.is_alive():
            server.kill()
            server.join()
        for name in os.listdir(ipc_dir):
            os.unlink(os.path.join(ipc_dir, name))
        os.rmdir(ipc_dir)


# --------------------------------------------------------------------------- output
def fmt_t(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f}us"
    if s < 1:
        return f"{s * 1e3:.1f}ms"
    return f"{s:.2f}s"


def fmt_bw(b: float | None) -> str:
    return "-" if b is None else f"{b / 1e9:.2f}"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def print_table(results: dict, mechs: list[str], quick: bool) -> None:
    head = ["mech", "payload", "rtt raw med/p99", "rtt wire med/p99", "b/a", "rtt node med/p99",
            "bw raw GB/s", "bw wire GB/s", "b/a", "bw node GB/s", "memcpy GB/s"]
    rows = []
    for mech in mechs:
        for p in payloads(quick):
            r = results[(mech, p.label)]
            ra, rb, rc = r["rtt_raw"], r["rtt_wire"], r["rtt_node"]
            ba, bb, bc = r.get("bw_raw"), r.get("bw_wire"), r.get("bw_node")
            rows.append([
                mech, p.label,
                f"{fmt_t(ra[0])}/{fmt_t(ra[1])}", f"{fmt_t(rb[0])}/{fmt_t(rb[1])}",
                fmt_ratio(rb[0] / ra[0]), f"{fmt_t(rc[0])}/{fmt_t(rc[1])}",
                fmt_bw(ba), fmt_bw(bb), fmt_ratio(bb / ba if ba and bb else None), fmt_bw(bc),
                fmt_bw(memcpy_bw(p.nbytes)) if p.nbytes else "-",
            ])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(  # noqa: E731
        str(c).ljust(w) if i < 2 else str(c).rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(head))
    print("  ".join("-" * w for w in widths))
    for mech_rows in [rows[i:i + len(payloads(quick))] for i in range(0, len(rows),
                                                                        len(payloads(quick)))]:
        for row in mech_rows:
            print(line(row))
    print()
    print("raw  = pyzmq DEALER->ROUTER, array as one raw frame (np.frombuffer on receipt)")
    print("wire = same sockets, actorpy.wire.message.assemble / Message.parse / .payload()")
    print("node = two actorpy Nodes: node.call echo (rtt) / node.send stream + call (bw)")
    print("rtt b/a: lower is better (target <= 1.5 for the tiny message); "
          "bw b/a: higher is better (target >= 0.8 from 1 MB up)")
    verdicts = []
    for mech in mechs:
        small = results[(mech, SMALL)]
        ratio = small["rtt_wire"][0] / small["rtt_raw"][0]
        verdicts.append(f"{mech}: tiny rtt b/a {ratio:.2f} "
                        f"({'met' if ratio <= 1.5 else 'MISSED'})")
        for p in payloads(quick):
            if p.nbytes >= 1 << 20:
                r = results[(mech, p.label)]
                bwr = r["bw_wire"] / r["bw_raw"]
                verdicts.append(f"{mech}: {p.label} bw b/a {bwr:.2f} "
                                f"({'met' if bwr >= 0.8 else 'MISSED'})")
    print("targets: " + "; ".join(verdicts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (~1 min)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="raw/wire/node alternations (default 2, quick 1)")
    parser.add_argument("--mech", default="ipc,curve",
                        help="comma-separated mechanisms to run: ipc, curve")
    parser.add_argument("--objects-mb", type=int, default=None,
                        help="pickled size of the Python-objects row (default 50, quick 10)")
    parser.add_argument("--objects-only", action="store_true",
                        help="run only the Python-objects row")
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    mechs = [m for m in args.mech.split(",") if m]
    objects_mb = args.objects_mb or (10 if args.quick else 50)
    if args.objects_only:
        objects_row(mechs, objects_mb, reps=1 if args.quick else 3)
        return 0
    results: dict = {}
    t0 = time.perf_counter()
    for mech in mechs:
        run_mechanism(mech, args.quick, results, args.rounds)
    print(f"actorpy transport benchmark ({'quick' if args.quick else 'full'}; pyzmq "
          f"{zmq.__version__}, libzmq {zmq.zmq_version()}, {os.cpu_count()} cores; "
          f"{time.perf_counter() - t0:.0f} s)\n")
    print_table(results, mechs, args.quick)
    cpu_per_message(args.quick)
    objects_row(mechs, objects_mb, reps=1 if args.quick else 3)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The PS benchmark's baselines: a hand-written plain-pyzmq parameter server (a ROUTER
server process and DEALER worker processes over ipc, BSP or ASP; also the rate test's
byte mover) and single-process SGD on all the rows. bench/ps.py runs them beside actorpy.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import zmq

from ps_problem import error, gradient, half, straggler_wait, w_star


def plain_server(address: str, mode: str, workers: int, features: int, lr: float,
                 seed: int, target: float, max_updates: int, conn: Any) -> None:
    """ROUTER: gradients in, fresh weights out; BSP averages a round, ASP applies each."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    sock.bind(address)
    conn.send("bound")
    ws = w_star(seed, features) if target > 0 else None
    w = np.zeros(features, dtype=np.float32)
    lr32 = np.float32(lr)
    ready = [sock.recv_multipart()[0] for _ in range(workers)]   # the start barrier
    t0 = time.perf_counter()
    for ident in ready:
        sock.send_multipart([ident, b"go", w], copy=False)
    updates, stopped, round_ = 0, 0, []
    done = False
    while stopped < workers:
        ident, frame = sock.recv_multipart(copy=False)
        ident = ident.bytes
        if done:
            sock.send_multipart([ident, b"stop", w])
            stopped += 1
            continue
        g = np.frombuffer(frame.buffer, dtype=np.float32)
        if mode == "asp":
            w = w - lr32 * g
            updates += 1
            done = (ws is not None and error(w, ws) < target) or updates >= max_updates
            sock.send_multipart([ident, b"stop" if done else b"go", w], copy=False)
            stopped += done
            continue
        round_.append((ident, g))
        if len(round_) < workers:
            continue
        w = w - lr32 * (sum(gi for _, gi in round_) * np.float32(1.0 / workers))
        updates += workers
        done = (ws is not None and error(w, ws) < target) or updates >= max_updates
        for rid, _ in round_:
            sock.send_multipart([rid, b"stop" if done else b"go", w], copy=False)
        stopped += workers if done else 0
        round_ = []
    seconds = time.perf_counter() - t0
    conn.send((seconds, updates, error(w, ws) if ws is not None else 0.0))
    sock.close()
    ctx.term()


def plain_worker(address: str, slot: int, rows: int, features: int, batch: int, seed: int,
                 slow: bool, rate_floats: int, slack_ns: int) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(address)
    if rate_floats:
        update = np.full(rate_floats, 1e-6, dtype=np.float32)
    else:
        x, y = half(seed, slot, rows, features)
    rng = np.random.default_rng([seed, slot])
    sock.send(b"ready")
    while True:
        kind, frame = sock.recv_multipart(copy=False)
        if kind.bytes == b"stop":
            break
        w = np.frombuffer(frame.buffer, dtype=np.float32)
        if rate_floats:
            sock.send(update, copy=False)
            continue
        t0 = time.perf_counter()
        i = rng.integers(0, len(y), batch)
        g = gradient(w, x[i], y[i])
        if slow and slot == 1:
            straggler_wait(t0, slack_ns)
        sock.send(g, copy=False)
    sock.close()
    ctx.term()


def plain_run(args: argparse.Namespace, mode: str, straggle: bool, workers: int = 2,
              rate_floats: int = 0, max_updates: int = 10**9) -> tuple[float, int, float]:
    spawn = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="bench-ps-")
    os.chmod(tmp, 0o700)
    address = f"ipc://{tmp}/server"
    features = rate_floats or args.features
    parent, child = spawn.Pipe()
    server = spawn.Process(target=plain_server, args=(
        address, mode, workers, features, args.lr, args.seed,
        0.0 if rate_floats else args.target, max_updates, child))
    server.start()
    procs: list[Any] = []
    try:
        assert parent.poll(60) and parent.recv() == "bound"
        procs += [spawn.Process(target=plain_worker, args=(
            address, slot, args.rows // 2, features, args.batch, args.seed, straggle,
            rate_floats, args.straggler_slack_ns)) for slot in range(workers)]
        for p in procs:
            p.start()
        if not parent.poll(args.timeout):
            raise TimeoutError(f"plain {mode} did not finish within {args.timeout} s")
        result = parent.recv()
        for p in procs:
            p.join(30)
        return result
    finally:
        for p in [server, *procs]:
            if p.is_alive():
                p.kill()
            p.join(10)
        shutil.rmtree(tmp, ignore_errors=True)


def single_process(args: argparse.Namespace) -> tuple[float, int, float]:
    parts = [half(args.seed, s, args.rows // 2, args.features) for s in (0, 1)]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    del parts
    ws, w = w_star(args.seed, args.features), np.zeros(args.features, dtype=np.float32)
    rng, lr = np.random.default_rng([args.seed, 0]), np.float32(args.lr)
    t0, updates = time.perf_counter(), 0
    while error(w, ws) >= args.target:
        i = rng.integers(0, len(y), args.batch)
        w = w - lr * gradient(w, x[i], y[i])
        updates += 1
        if time.perf_counter() - t0 > args.timeout:
            raise TimeoutError("single-process SGD did not reach the target")
    return time.perf_counter() - t0, updates, error(w, ws)

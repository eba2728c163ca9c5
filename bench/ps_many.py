"""The PS benchmark's many-keys rows (bench/ps.py ``--only many-keys``): a model of KEYS
float32 arrays of SIZE each (1 000 x 100, 100 x 1 000, 10 x 10 000: the same 400 KB), 2
workers, BSP, a fixed number of steps; each worker's push returns one (fixed) update per
key and the server folds ``w - lr * u`` per key into the round's mean. Timed: ms per step
of actorpy's param engine against a plain-pyzmq PS moving the same arrays the same way
(a ROUTER server process and two DEALER worker processes over ipc; a message is the dict
of arrays pickled with protocol 5, buffers over 64 KB out of band, as plain pickle users
would send it), alternating, medians.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import zmq

SHAPES = ((1000, 100), (100, 1000), (10, 10_000))
LR = np.float32(0.01)
_OUT_OF_BAND = 64 << 10


def model(keys: int, size: int) -> dict[str, np.ndarray]:
    return {f"layer{i:05d}": np.zeros(size, np.float32) for i in range(keys)}


def _frames(values: dict[str, np.ndarray]) -> list[Any]:
    buffers: list[Any] = []

    def keep(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < _OUT_OF_BAND:
            return True
        buffers.append(buffer.raw())
        return False
    return [pickle.dumps(values, protocol=5, buffer_callback=keep), *buffers]


def _values(frames: list[Any]) -> dict[str, np.ndarray]:
    return pickle.loads(frames[0].buffer, buffers=[f.buffer for f in frames[1:]])


def plain_server(address: str, keys: int, size: int, steps: int, conn: Any) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    sock.bind(address)
    conn.send("bound")
    w = model(keys, size)
    ready = [sock.recv_multipart()[0] for _ in range(2)]
    t0 = time.perf_counter()
    for ident in ready:
        sock.send_multipart([ident, b"go", *_frames(w)], copy=False)
    for step in range(1, steps + 1):
        round_ = []
        for _ in range(2):
            ident, *frames = sock.recv_multipart(copy=False)
            round_.append((ident.bytes, _values(frames)))
        w = {k: v - LR * ((round_[0][1][k] * 0.5) + round_[1][1][k] * 0.5)
             for k, v in w.items()}
        kind = b"stop" if step == steps else b"go"
        frames = _frames(w)
        for ident, _ in round_:
            sock.send_multipart([ident, kind, *frames], copy=False)
    conn.send(time.perf_counter() - t0)
    sock.close()
    ctx.term()


def plain_worker(address: str, keys: int, size: int) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(address)
    update = {k: np.full(size, 1e-3, np.float32) for k in model(keys, size)}
    sock.send(b"ready")
    while True:
        kind, *frames = sock.recv_multipart(copy=False)
        if kind.bytes == b"stop":
            break
        _values(frames)
        sock.send_multipart(_frames(update), copy=False)
    sock.close()
    ctx.term()


def plain_many(keys: int, size: int, steps: int, timeout: float) -> float:
    """Seconds per step of the plain PS."""
    spawn = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="bench-many-")
    os.chmod(tmp, 0o700)
    address = f"ipc://{tmp}/server"
    parent, child = spawn.Pipe()
    procs = [spawn.Process(target=plain_server, args=(address, keys, size, steps, child))]
    procs[0].start()
    try:
        assert parent.poll(60) and parent.recv() == "bound"
        procs += [spawn.Process(target=plain_worker, args=(address, keys, size))
                  for _ in range(2)]
        for p in procs[1:]:
            p.start()
        if not parent.poll(timeout):
            raise TimeoutError(f"plain many-keys did not finish within {timeout} s")
        return parent.recv() / steps
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(10)
        shutil.rmtree(tmp, ignore_errors=True)


class ManyData:
    def __init__(self, keys: int, size: int) -> None:
        self.keys, self.size = keys, size

    def __call__(self, ctx: Any) -> dict[str, np.ndarray]:
        return {k: np.full(self.size, 1e-3, np.float32) for k in model(self.keys, self.size)}


class ManyPush:
    def __call__(self, ctx: Any, values: dict[str, Any]) -> dict[str, Any]:
        return ctx.data


class ManyPull:
    def __call__(self, store: Any, updates: dict[str, Any]) -> None:
        for key, update in updates.items():
            store.set(key, store.get(key)[0] - LR * update)


class ManyStop:
    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __call__(self, store: Any) -> bool:
        return store.step >= self.steps


def actorpy_many(cluster: Any, keys: int, size: int, steps: int, timeout: float) -> float:
    """Seconds per step of the param engine (BSP, the shard on worker 1)."""
    from actorpy.barrier import BSP
    from engines import param

    job = param.Job("bench-many", barrier=BSP(), seed=0, data=ManyData(keys, size))
    job.register_push(ManyPush())
    job.register_pull(ManyPull())
    job.register_stop(ManyStop(steps))
    run = job.start(cluster, init=model(keys, size), timeout_s=timeout)
    run.result()
    return run.stats.seconds / max(run.stats.updates // 2, 1)


def report(cluster: Any, repeat: int, timeout: float) -> None:
    print("\nmany small keys: 2 workers, BSP, one update per key a step, w - lr*u per key; "
          f"ms per step, medians of {repeat} alternating runs")
    for keys, size in SHAPES:
        steps = max(20, 20_000 // keys)
        ours, plain = [], []
        for _ in range(repeat):
            ours.append(actorpy_many(cluster, keys, size, steps, timeout))
            plain.append(plain_many(keys, size, steps, timeout))
        a, p = statistics.median(ours), statistics.median(plain)
        print(f"  {keys:>5} keys x {size:>6} float32: actorpy {1000 * a:7.2f} ms   plain pyzmq "
              f"{1000 * p:7.2f} ms   ratio {a / p:.2f}", flush=True)

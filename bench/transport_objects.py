"""The transport benchmark's Python-objects row: a list of (str, int) tuples whose pickle is
~50 MB, sent from one process to another, against pickling + raw pyzmq.

* ``raw``:  ``pickle.dumps`` -> one ``copy=False`` frame on a DEALER -> ROUTER ->
  ``pickle.loads`` of the received frame -> a small ack. The floor for Python objects.
* ``node``: two ``actorpy.runtime.node.Node``s; ``node.call`` carries the list, the receiving
  handler unpickles it (``msg.payload()``) and answers its length: what a worker pays to
  send a worker a big object graph (cloudpickle, the body split into frames, no copy).

Every repetition runs in two fresh processes (spawn), so each reports its own peak RSS
(VmHWM): the sender's is measured against its RSS with the list already built, the
receiver's against its RSS before the message arrived (the unpickled list is included,
as it is in what any receiver keeps). Time: from the start of pickling to the ack.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zmq  # noqa: E402

from actorpy.runtime.node import Node  # noqa: E402
from actorpy.wire import auth  # noqa: E402

SECRET = b"bench-transport-objects-secret-0123"
SERVICE, OBJECTS = 1, 7
TIMEOUT_S = 300.0
BYTES_PER_RECORD = 17  # pickled (str of ~9 chars, int) with its memo opcodes


def rss_mb(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def build(nbytes: int) -> list[tuple[str, int]]:
    return [(f"word{(i * 7919) % 100_000}", i) for i in range(nbytes // BYTES_PER_RECORD)]


def _security(mech: str) -> auth.Security:
    return auth.Security.ipc() if mech == "ipc" else auth.Security.curve(SECRET)


def _endpoint(mech: str, ipc_dir: str, name: str) -> str:
    return f"ipc://{ipc_dir}/{name}" if mech == "ipc" else "tcp://127.0.0.1:*"


def receiver(conn: Any, mech: str, impl: str, ipc_dir: str) -> None:
    security = _security(mech)
    base = rss_mb()
    if impl == "node":
        node = Node("obj-r", _endpoint(mech, ipc_dir, "obj-r"), security).start()
        got: list[int] = []
        node.on(SERVICE, OBJECTS, lambda m: (got.append(len(m.payload())),
                                             node.reply(m, got[-1])))
        conn.send(node.address)
        node.add_peer("obj-s", conn.recv(), "worker")
        conn.send("ready")
        conn.recv()  # "done"
        node.close()
        count = got[0]
    else:
        ctx = zmq.Context()
        authenticator = security.start_authenticator(ctx)
        sock = ctx.socket(zmq.ROUTER)
        sock.linger = 0
        security.apply_server(sock)
        sock.bind(_endpoint(mech, ipc_dir, "obj-raw"))
        conn.send(sock.getsockopt_string(zmq.LAST_ENDPOINT))
        conn.recv()
        conn.send("ready")
        ident, frame = sock.recv_multipart(copy=False)
        value = pickle.loads(frame.buffer)
        count = len(value)
        sock.send_multipart([ident, b"ok"])
        conn.recv()  # "done"
        sock.close(linger=0)
        if authenticator is not None:
            authenticator.stop()
        ctx.term()
    conn.send({"count": count, "base_mb": base, "hwm_mb": rss_mb("VmHWM")})


def sender(conn: Any, mech: str, impl: str, ipc_dir: str, nbytes: int, address: str) -> None:
    security = _security(mech)
    value = build(nbytes)
    pickled = len(pickle.dumps(value[:10_000], protocol=5)) * len(value) / 10_000
    base = rss_mb()
    if impl == "node":
        node = Node("obj-s", _endpoint(mech, ipc_dir, "obj-s"), security).start()
        node.add_peer("obj-r", address, "worker")
        conn.send(node.address)
        conn.recv()  # "go"
        t0 = time.perf_counter()
        count = node.call("obj-r", SERVICE, OBJECTS, value, timeout_s=TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        node.close()
    else:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        security.apply_client(sock)
        sock.connect(address)
        conn.send("connected")
        conn.recv()  # "go"
        t0 = time.perf_counter()
        sock.send(pickle.dumps(value, protocol=5), copy=False)
        if not sock.poll(int(TIMEOUT_S * 1000)):
            raise TimeoutError("no ack from the raw receiver")
        sock.recv()
        elapsed = time.perf_counter() - t0
        count = len(value)
        sock.close(linger=0)
        ctx.term()
    conn.send({"s": elapsed, "count": count, "base_mb": base, "hwm_mb": rss_mb("VmHWM"),
               "pickled": pickled, "records": len(value)})


def one_run(mech: str, impl: str, nbytes: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ipc_dir = auth.private_dir("actorpy-bench-obj-")
    r_parent, r_child = ctx.Pipe()
    s_parent, s_child = ctx.Pipe()
    recv_proc = ctx.Process(target=receiver, args=(r_child, mech, impl, ipc_dir), daemon=True)
    recv_proc.start()
    try:
        address = _answer(r_parent)
        send_proc = ctx.Process(target=sender, args=(s_child, mech, impl, ipc_dir, nbytes,
                                                     address), daemon=True)
        send_proc.start()
        try:
            r_parent.send(_answer(s_parent))  # the sender's address (or "connected")
            _answer(r_parent)  # "ready"
            s_parent.send("go")
            sent = _answer(s_parent)
            r_parent.send("done")
            received = _answer(r_parent)
        finally:
            send_proc.join(timeout=30)
            if send_proc.is_alive():
                send_proc.kill()
    finally:
        recv_proc.join(timeout=30)
        if recv_proc.is_alive():
            recv_proc.kill()
        for name in os.listdir(ipc_dir):
            os.unlink(os.path.join(ipc_dir, name))
        os.rmdir(ipc_dir)
    if not sent["count"] == received["count"] == sent["records"]:
        raise RuntimeError(f"{impl}: sent {sent['records']} records, got {received['count']}")
    return {"sent": sent, "received": received}


def _answer(conn: Any) -> Any:
    if not conn.poll(TIMEOUT_S):
        raise TimeoutError(f"a benchmark process did not answer within {TIMEOUT_S} s")
    return conn.recv()


def objects_row(mechs: list[str], megabytes: int, reps: int) -> None:
    """Print the Python-objects table: time and peak RSS of both ends, raw vs node."""
    nbytes = megabytes << 20
    print(f"Python objects: a list of (str, int) tuples, ~{megabytes} MB pickled, one process "
          f"to another (fresh processes per run; median time of {reps}, peak RSS above "
          "baseline: the largest)")
    head = f"{'mech':<6} {'impl':<5} {'records':>9} {'pickle MB':>9} {'time s':>7} {'b/a':>5} " \
           f"{'sender +MB':>10} {'receiver +MB':>12}"
    print(head)
    print("-" * len(head))
    for mech in mechs:
        results: dict[str, list[dict[str, Any]]] = {}
        for _ in range(reps):
            for impl in ("raw", "node"):  # alternated, so drift hits both alike
                results.setdefault(impl, []).append(one_run(mech, impl, nbytes))
        raw_time = statistics.median(r["sent"]["s"] for r in results["raw"])
        for impl, runs in results.items():
            t = statistics.median(r["sent"]["s"] for r in runs)
            s_up = max(r["sent"]["hwm_mb"] - r["sent"]["base_mb"] for r in runs)
            r_up = max(r["received"]["hwm_mb"] - r["received"]["base_mb"] for r in runs)
            first = runs[0]["sent"]
            print(f"{mech:<6} {impl:<5} {first['records']:>9} {first['pickled'] / 2**20:>9.1f} "
                  f"{t:>7.2f} {t / raw_time:>5.2f} {s_up:>10.0f} {r_up:>12.0f}")
    print("raw  = pickle.dumps + one copy=False frame over pyzmq + pickle.loads")
    print("node = actorpy Node.call carrying the list; the handler unpickles it (msg.payload())")
    print("time b/a: lower is better; sender +MB: peak above its RSS with the list built; "
          "receiver +MB: peak above its RSS before receiving (the unpickled list included)")
    print()

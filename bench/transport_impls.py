"""The transport benchmark's three implementations (``raw`` pyzmq, actorpy's ``wire``, the
full ``node`` runtime): how each frames, encodes and decodes a message, the server process
that serves one of them at a time (``server_main``, run under spawn), and the client of each.

bench/transport.py drives them and prints the table; see its docstring for what is measured.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

# Benchmark the checkout this script lives in, not whatever actorpy is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import zmq  # noqa: E402

from actorpy.runtime.node import Node  # noqa: E402
from actorpy.wire import auth  # noqa: E402
from actorpy.wire import message as wm  # noqa: E402
from actorpy.wire.kinds import CORE_SERVICE, Kind  # noqa: E402

SECRET = b"bench-transport-secret-0123456789"
SERVER_ID, CLIENT_ID = "bench-s", "bench-c"
BENCH_SERVICE = 1
ECHO, SINK, FLUSH = 1, 2, 3
MAX_FRAME = 1 << 30
TIMEOUT_S = 120.0


# --------------------------------------------------------------------------- raw / wire codecs
def send_frames(sock: zmq.Socket, frames: list[Any]) -> None:
    """Send frames the way Node does: zero-copy from 64 KB, copying below."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        big = not isinstance(frame, bytes) and memoryview(frame).nbytes >= wm.ZERO_COPY_MIN_BYTES
        sock.send(frame, zmq.SNDMORE if i < last else 0, copy=not big)


def raw_frames(value: Any) -> list[Any]:
    if isinstance(value, int):
        return [b"\0" * 8]
    if isinstance(value, bytes):
        return [value]
    if isinstance(value, np.ndarray):
        return [value]
    return [value.numpy()]  # torch tensor


def raw_decode(frames: list[zmq.Frame], kind: str) -> Any:
    frame = frames[-1]
    if kind == "small":
        return frame.bytes
    arr = np.frombuffer(frame.buffer, dtype=np.float32)
    if kind == "torch":
        import torch
        return torch.from_numpy(arr)
    return arr


def wire_frames(value: Any, sender: str, kind: int, security: auth.Security,
                request_id: int = 0) -> list[Any]:
    return wm.assemble(CORE_SERVICE, kind, sender, value, request_id=request_id,
                       chunk_bytes=security.chunk_bytes)


def wire_decode(frames: list[zmq.Frame], security: auth.Security, has_identity: bool) -> Any:
    if has_identity and not security.is_trusted(frames[0]):
        raise RuntimeError("untrusted frame in the benchmark")
    msg = wm.Message.parse(frames[1:] if has_identity else frames, MAX_FRAME)
    return msg.payload()

# --------------------------------------------------------------------------- server process
def security_for(mech: str) -> auth.Security:
    return auth.Security.ipc() if mech == "ipc" else auth.Security.curve(SECRET)


def endpoint(mech: str, ipc_dir: str, name: str) -> str:
    return f"ipc://{ipc_dir}/{name}" if mech == "ipc" else "tcp://127.0.0.1:*"


def server_main(conn: Any, mech: str, ipc_dir: str) -> None:
    """Serve one implementation at a time, driven by commands on ``conn``."""
    security = security_for(mech)
    while True:
        cmd = conn.recv()
        if cmd[0] == "stop":
            return
        impl = cmd[1]
        if impl == "node":
            _serve_node(conn, mech, ipc_dir, security)
        else:
            _serve_socket(conn, mech, ipc_dir, security, impl)


def _serve_socket(conn: Any, mech: str, ipc_dir: str, security: auth.Security,
                  impl: str) -> None:
    ctx = zmq.Context()
    authenticator = security.start_authenticator(ctx)
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    sock.rcvhwm = sock.sndhwm = 0
    security.apply_server(sock)
    sock.bind(endpoint(mech, ipc_dir, f"srv-{impl}"))
    conn.send(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        while True:
            cmd = conn.recv()
            if cmd[0] == "done":
                return
            op, n, kind = cmd
            for i in range(n):
                frames = sock.recv_multipart(copy=False)
                ident = frames[0]
                if impl == "raw":
                    value = raw_decode(frames, kind)
                    out = raw_frames(value) if op == "echo" else None
                else:
                    value = wire_decode(frames, security, has_identity=True)
                    out = (wire_frames(value, SERVER_ID, Kind.RESULT, security)
                           if op == "echo" else None)
                if out is not None:
                    send_frames(sock, [ident, *out])
                elif i == n - 1:  # sink: one small ack after the last message
                    ack = ([b"ok"] if impl == "raw"
                           else wire_frames(n, SERVER_ID, Kind.RESULT, security))
                    send_frames(sock, [ident, *ack])
            conn.send("ok")
    finally:
        sock.close(linger=0)
        if authenticator is not None:
            authenticator.stop()
        ctx.term()


def _serve_node(conn: Any, mech: str, ipc_dir: str, security: auth.Security) -> None:
    node = Node(SERVER_ID, endpoint(mech, ipc_dir, "srv-node"), security,
                max_frame_bytes=MAX_FRAME).start()
    received = [0]

    def sink(msg: wm.Message) -> None:
        msg.payload()
        received[0] += 1

    node.on(BENCH_SERVICE, ECHO, lambda msg: node.reply(msg, msg.payload()))
    node.on(BENCH_SERVICE, SINK, sink)
    node.on(BENCH_SERVICE, FLUSH, lambda msg: node.reply(msg, received[0]))
    conn.send(node.address)
    client_address = conn.recv()
    node.add_peer(CLIENT_ID, client_address, "driver")
    conn.send("ok")
    try:
        conn.recv()  # "done"
    finally:
        node.close()


# --------------------------------------------------------------------------- client side
def recv(sock: zmq.Socket) -> list[zmq.Frame]:
    if not sock.poll(int(TIMEOUT_S * 1000)):
        raise TimeoutError(f"no answer from the server within {TIMEOUT_S} s (see its traceback)")
    return sock.recv_multipart(copy=False)


def answer(conn: Any) -> Any:
    if not conn.poll(TIMEOUT_S):
        raise TimeoutError(f"the server process did not answer within {TIMEOUT_S} s")
    return conn.recv()


class SocketClient:
    """Client for the raw / wire implementations."""

    def __init__(self, conn: Any, mech: str, impl: str, security: auth.Security) -> None:
        self.conn, self.impl, self.security = conn, impl, security
        conn.send(("serve", impl))
        address = answer(conn)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.rcvhwm = self.sock.sndhwm = 0
        security.apply_client(self.sock)
        self.sock.connect(address)

    def frames(self, value: Any) -> list[Any]:
        if self.impl == "raw":
            return raw_frames(value)
        return wire_frames(value, CLIENT_ID, Kind.TASK, self.security, request_id=1)

    def decode(self, frames: list[zmq.Frame], kind: str) -> Any:
        if self.impl == "raw":
            return raw_decode(frames, kind)
        return wire_decode(frames, self.security, has_identity=False)

    def rtt(self, value: Any, kind: str, n: int) -> list[float]:
        warm = max(2, n // 10)
        self.conn.send(("echo", warm + n, kind))
        samples = []
        for i in range(warm + n):
            t0 = time.perf_counter()
            send_frames(self.sock, self.frames(value))
            self.decode(recv(self.sock), kind)
            if i >= warm:
                samples.append(time.perf_counter() - t0)
        answer(self.conn)
        return samples

    def bandwidth(self, value: Any, kind: str, k: int, reps: int) -> list[float]:
        times = []
        for rep in range(reps + 1):  # the first repetition warms up
            self.conn.send(("sink", k, kind))
            t0 = time.perf_counter()
            for _ in range(k):
                send_frames(self.sock, self.frames(value))
            recv(self.sock)
            if rep:
                times.append(time.perf_counter() - t0)
            answer(self.conn)
        return times

    def close(self) -> None:
        self.conn.send(("done",))
        self.sock.close(linger=0)
        self.ctx.term()


class NodeClient:
    """Client for the full runtime path."""

    def __init__(self, conn: Any, mech: str, ipc_dir: str, security: auth.Security) -> None:
        self.conn = conn
        conn.send(("serve", "node"))
        server_address = answer(conn)
        self.node = Node(CLIENT_ID, endpoint(mech, ipc_dir, "cli-node"), security,
                         max_frame_bytes=MAX_FRAME).start()
        self.node.add_peer(SERVER_ID, server_address, "worker")
        conn.send(self.node.address)
        answer(conn)

    def rtt(self, value: Any, kind: str, n: int) -> list[float]:
        warm = max(2, n // 10)
        samples = []
        for i in range(warm + n):
            t0 = time.perf_counter()
            self.node.call(SERVER_ID, BENCH_SERVICE, ECHO, value, timeout_s=TIMEOUT_S)
            if i >= warm:
                samples.append(time.perf_counter() - t0)
        return samples

    def bandwidth(self, value: Any, kind: str, k: int, reps: int) -> list[float]:
        times = []
        for rep in range(reps + 1):
            t0 = time.perf_counter()
            for _ in range(k):
                self.node.send(SERVER_ID, BENCH_SERVICE, SINK, value)
            self.node.call(SERVER_ID, BENCH_SERVICE, FLUSH, timeout_s=TIMEOUT_S)
            if rep:
                times.append(time.perf_counter() - t0)
        return times

    def close(self) -> None:
        self.conn.send(("done",))
        self.node.close()

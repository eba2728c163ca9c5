"""Outsiders on loopback, without the secret: a huge handshake frame does not grow the
receiver's memory, and file descriptors run out without killing the I/O loop. Loops bounded."""
from __future__ import annotations

import errno
import logging
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import types

import pytest
import zmq

from actorpy.config import Config
from actorpy.errors import ActorpyError, NodeLost
from actorpy.ids import NodeId
from actorpy.runtime.directory import Directory
from actorpy.runtime import node as node_module
from actorpy.runtime.node import Node
from actorpy.wire import header as hdr
from actorpy.wire.auth import Security, curve_keypair
from actorpy.wire.kinds import PROTOCOL_VERSION, Kind
from tests.conftest import wait_until

SECRET = b"hostile-tests-cluster-secret-0123456789"
#: a ZMTP 3.0 greeting announcing CURVE, as a client
GREETING = b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"CURVE".ljust(20, b"\0") + b"\0" * 32


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("config", [Config(chunk_bytes=1 << 20, max_frame_bytes=1 << 20),
                                    Config()], ids=["1MiB", "default"])
def test_a_huge_handshake_frame_from_an_outsider_is_refused_before_it_is_buffered(config):
    # default: before, max_frame_bytes was 1 GiB, and an outsider's 256 MiB frame was kept
    security = Security.curve(SECRET)
    server = Node.from_config(NodeId("srv"), "tcp://127.0.0.1:*", security, config).start()
    client = Node.from_config(NodeId("cli"), "tcp://127.0.0.1:*", security, config).start()
    try:
        server.on(9, 1, lambda msg: server.reply(msg, msg.payload()))
        client.add_peer(NodeId("srv"), server.address, "worker")
        server.add_peer(NodeId("cli"), client.address, "driver")
        port = int(server.address.rsplit(":", 1)[1])
        before = _rss()
        sent, cut = 0, False
        chunk = b"\0" * (1 << 20)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as outsider:
            outsider.sendall(GREETING)
            # A command frame (flags: command, long size) announcing 256 MiB, then its bytes.
            outsider.sendall(b"\x06" + struct.pack("!Q", 256 << 20))
            try:
                for _ in range(64):  # at most 64 MiB: bounded either way
                    outsider.sendall(chunk)
                    sent += len(chunk)
                cut = outsider.recv(1) == b""
            except OSError:  # reset or broken pipe: the receiver hung up on us
                cut = True
        grown = _rss() - before
        assert cut, f"the receiver took {sent >> 20} MiB of one pre-handshake frame"
        assert grown < 16 << 20, f"the receiver grew by {grown >> 20} MiB"
        assert client.call(NodeId("srv"), 9, 1, "member", timeout_s=30) == "member"
    finally:
        client.close()
        server.close()


def test_under_curve_a_connection_without_the_secret_is_cut_past_the_chunk_size():
    """By default a CURVE node refuses a frame over its senders' chunk size (8 MiB), so a
    connection that has not proved the secret makes it buffer at most that: before it was
    64 MiB, and 30 outsiders' connections held 1.8 GB of a manager for the 10 s of their
    handshake. A member's 20 MB array still travels (split into chunks)."""
    import numpy as np

    security = Security.curve(SECRET)
    server = Node.from_config(NodeId("srv"), "tcp://127.0.0.1:*", security, Config()).start()
    client = Node.from_config(NodeId("cli"), "tcp://127.0.0.1:*", security, Config()).start()
    try:
        server.on(9, 1, lambda msg: server.reply(msg, msg.payload()))
        client.add_peer(NodeId("srv"), server.address, "worker")
        server.add_peer(NodeId("cli"), client.address, "driver")
        port = int(server.address.rsplit(":", 1)[1])
        sent, chunk = 0, b"\0" * (1 << 20)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as outsider:
            outsider.sendall(GREETING + b"\x06" + struct.pack("!Q", 32 << 20))
            try:
                for _ in range(32):
                    outsider.sendall(chunk)
                    sent += len(chunk)
                outsider.recv(1)
            except OSError:  # reset or broken pipe: the receiver hung up on us
                pass
        # what the kernel's buffers took before the hang-up was seen, at most
        assert sent < 16 << 20, f"the receiver took {sent >> 20} MiB of a 32 MiB frame"
        big = np.arange(5 << 20, dtype=np.float32)             # 20 MiB
        assert np.array_equal(client.call(NodeId("srv"), 9, 1, big, timeout_s=60), big)
    finally:
        client.close()
        server.close()


def test_an_outsider_that_never_finishes_its_handshake_is_cut_off(monkeypatch):
    # before: libzmq's default of 30 s, what it sent held all along
    monkeypatch.setattr(node_module, "HANDSHAKE_S", 0.5)
    server = Node.from_config(NodeId("srv"), "tcp://127.0.0.1:*", Security.curve(SECRET),
                              Config()).start()
    try:
        port = int(server.address.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as outsider:
            outsider.sendall(GREETING)   # and then nothing: no HELLO
            outsider.settimeout(10)    # before: socket.timeout (30 s for the server)
            cut = False
            while not cut:   # the server's greeting, then the end
                try:
                    cut = outsider.recv(1 << 16) == b""
                except ConnectionResetError:
                    cut = True
    finally:
        server.close()


@pytest.mark.parametrize("version, service, said", [
    (9, 0, "protocol version 9"), (PROTOCOL_VERSION, 77, "no service 77")],
    ids=["another-release", "no-such-service"])
def test_a_member_s_flood_of_bad_messages_is_logged_once_not_per_message(version, service,
                                                                          said, caplog):
    # before: 20 000 messages of another version made 20 000 WARNING lines (2.7 MB of log)
    server = Node.from_config(NodeId("srv"), "tcp://127.0.0.1:*", Security.curve(SECRET),
                              Config()).start()
    ctx = zmq.Context()
    try:
        public, private = curve_keypair(SECRET)
        member = ctx.socket(zmq.DEALER)
        member.linger = 0
        member.curve_publickey, member.curve_secretkey, member.curve_serverkey = (
            public, private, public)
        member.routing_id = b"x-evil"
        member.connect(server.address)
        frame = hdr.encode(service, int(Kind.HEARTBEAT), b"x-evil", version=version)
        with caplog.at_level(logging.WARNING, logger="actorpy.runtime.receive"):
            for _ in range(500):
                member.send_multipart([frame])
            wait_until(lambda: server.bytes_in >= 500 * (len(frame) + len(b"x-evil")), 30,
                       "the flood taken")
        lines = [r.getMessage() for r in caplog.records if "x-evil" in r.getMessage()]
        assert len(lines) == 1 and said in lines[0], lines[:3]
    finally:
        ctx.destroy(linger=0)
        server.close()


def _limit_files(n: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def test_the_io_loop_survives_running_out_of_file_descriptors(tmp_path):
    secret = tmp_path / "cluster.secret"
    secret.write_text(SECRET.decode())
    secret.chmod(0o600)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    manager = subprocess.Popen(
        [sys.executable, "-m", "actorpy", "manager", "--bind", "tcp://127.0.0.1:*",
         "--secret-file", str(secret)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, preexec_fn=_limit_files(96))
    idle: list[socket.socket] = []
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(manager.stderr), daemon=True)
    reader.start()
    try:
        address = manager.stdout.readline().strip().rsplit(" ", 1)[-1]
        port = int(address.rsplit(":", 1)[1])
        for _ in range(150):  # more idle connections than the manager may open files
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        wait_until(lambda: len(os.listdir(f"/proc/{manager.pid}/fd")) >= 90, 10,
                   "the manager to run out of file descriptors")
        # One of them fails its handshake now (a NULL greeting to a CURVE server): the loop
        # must report it while no file can be opened.
        idle[0].sendall(GREETING.replace(b"CURVE", b"NULL\0"))
        wait_until(lambda: any("rejected a connection" in line or "Traceback" in line
                               for line in err), 20, "the manager to notice the failed handshake")
        for s in idle:
            s.close()
        idle.clear()
        status = subprocess.run([sys.executable, "-m", "actorpy", "status", "--manager", address,
                                 "--secret-file", str(secret), "--json", "--timeout-s", "20"],
                                capture_output=True, text=True, timeout=60, env=env)
        assert status.returncode == 0, status.stderr
        assert manager.poll() is None
    finally:
        for s in idle:
            s.close()
        manager.terminate()
        manager.wait(20)
        reader.join(10)
        manager.stdout.close()
        manager.stderr.close()
    assert not any("Traceback" in line for line in err), "".join(err)


def test_a_cluster_refuses_to_start_under_a_hard_open_files_limit_it_cannot_work_in():
    # under `ulimit -n 24` the demo failed where the next descriptor happened to be
    # opened: "nothing is listening at ...manager", a worker that "exited before joining",
    # or 30 s waiting for a manager that could not start
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-m", "actorpy", "demo"], capture_output=True,
                          text=True, env=env, timeout=120, preexec_fn=_limit_files(24))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "the open-files limit is 24" in done.stderr and "ulimit -n" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-2000:]


def test_a_low_soft_open_files_limit_is_raised_to_what_the_hard_one_allows():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"this machine's hard open-files limit is {hard}")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run(
        [sys.executable, "-m", "actorpy", "demo"], capture_output=True, text=True, env=env,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (24, hard)))
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_send_out_of_descriptors_blames_this_process_not_the_peer():
    # "cannot send to w-...: Too many open files" was a NodeLost: the peer read as lost
    fake = types.SimpleNamespace(_closed=False, _dead=set())
    with pytest.raises(ActorpyError, match="ulimit -n") as info:
        Directory._send_failed(fake, NodeId("w-1"), zmq.ZMQError(errno.EMFILE))
    assert not isinstance(info.value, NodeLost)
    with pytest.raises(NodeLost):   # any other failure still reads as the peer's
        Directory._send_failed(fake, NodeId("w-1"), zmq.ZMQError(errno.EHOSTUNREACH))

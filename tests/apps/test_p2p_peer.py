"""``actorpy peer`` processes started by hand (no manager anywhere): four join one by one,
the bootstrap peer is SIGKILLed once the others joined, and ``actorpy p2p-sgd --bootstrap``
submitted through a survivor still trains to the target with no model key lost."""
from __future__ import annotations

import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time

import pytest

from actorpy.errors import ConfigError
from actorpy.runtime.context import ServiceRef
from actorpy.wire import auth
from apps import p2p_peer
from engines.peer.dialer import PEER_SERVICE
from engines.peer.overlay_run import OverlayClient
from engines.peer.shell import PeerKind
from tests.conftest import catches_signal, wait_until

READY = re.compile(r"ready at (tcp://127\.0\.0\.1:\d+)")


def _first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The first line the process prints, waited for at most ``timeout_s``."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            pytest.fail(f"no line from {proc.args} within {timeout_s} s")
    return proc.stdout.readline()


def _peer(secret_file: str, bootstrap: str | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "actorpy", "peer", "--bind", "tcp://127.0.0.1:0",
           "--secret-file", secret_file]
    return subprocess.Popen(cmd + (["--bootstrap", bootstrap] if bootstrap else []),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _endpoint(proc: subprocess.Popen) -> str:
    line = _first_line(proc, 30)
    match = READY.search(line)
    stderr = proc.stderr.read() if proc.poll() is not None else ""
    assert match, f"not a ready line: {line!r}; stderr: {stderr}"
    return match.group(1)


@pytest.fixture
def secret_file(tmp_path):
    path = str(tmp_path / "cluster.secret")
    auth.write_secret_file(path, auth.generate_secret())
    return path


def test_peers_by_hand_bootstrap_killed_job_still_reaches_the_target(secret_file):
    procs = [_peer(secret_file)]
    try:
        bootstrap = _endpoint(procs[0])
        procs += [_peer(secret_file, bootstrap) for _ in range(3)]
        endpoints = [bootstrap] + [_endpoint(p) for p in procs[1:]]

        with OverlayClient(endpoints[1], secret_file=secret_file) as client:
            def everyone_knows_everyone() -> bool:
                members = client.members()
                tables = [client.call(ServiceRef(m.node_id, PEER_SERVICE), PeerKind.STATUS)
                          ["table"] for m in members]
                return len(members) == 4 and all(len(t) == 3 for t in tables)
            wait_until(everyone_knows_everyone, 20, "the four peers to know each other")

        procs[0].send_signal(signal.SIGKILL)         # the bootstrap peer dies, no goodbye
        procs[0].wait(10)
        out = subprocess.run(
            [sys.executable, "-m", "actorpy", "p2p-sgd", "--bootstrap", endpoints[2],
             "--secret-file", secret_file, "--steps", "3000", "--target", "0.05",
             "--rpc-timeout", "0.3", "--json"],
            capture_output=True, text=True, timeout=90)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["weight_error"] < 0.05                 # read back from the overlay
        assert len(result["steps_per_worker"]) == 3          # the three survivors trained
        assert max(result["steps_per_worker"]) < 3000        # stopped on the target
        for proc in procs[1:]:
            assert proc.poll() is None                       # still serving
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)             # leave: keys handed on
        deadline = time.monotonic() + 20
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for proc in procs[1:]:
            assert proc.returncode == 0, proc.stderr.read()


def test_clear_one_line_errors(secret_file, tmp_path):
    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "actorpy", "peer", *args],
                              capture_output=True, text=True, timeout=30,
                              env={**os.environ, **(env or {})})

    no_secret = run("--bind", "tcp://127.0.0.1:0", env={"ACTORPY_SECRET": ""})
    assert no_secret.returncode == 2 and "secret" in no_secret.stderr
    bad = run("--bind", "tcp://127.0.0.1", "--secret-file", secret_file)
    assert bad.returncode == 2 and "tcp://HOST:PORT" in bad.stderr
    # our sockets are IPv4 only: "No such device" for --bind, a 10 s wait for --bootstrap
    ipv6_bind = run("--bind", "tcp://[::1]:0", "--secret-file", secret_file)
    ipv6_boot = run("--bind", "tcp://127.0.0.1:0", "--bootstrap", "tcp://[::1]:7400",
                    "--secret-file", secret_file)
    for out in (ipv6_bind, ipv6_boot):
        assert out.returncode == 2 and "is an IPv6 address" in out.stderr, out.stderr
    first = _peer(secret_file)
    try:
        endpoint = _endpoint(first)
        taken = run("--bind", endpoint, "--secret-file", secret_file)
        assert taken.returncode == 2 and "cannot bind" in taken.stderr
        other = str(tmp_path / "other.secret")
        auth.write_secret_file(other, auth.generate_secret())
        wrong = run("--bind", "tcp://127.0.0.1:0", "--bootstrap", endpoint,
                    "--secret-file", other, "--timeout", "5")
        assert wrong.returncode == 1 and "secret differs" in wrong.stderr
        nobody = run("--bind", "tcp://127.0.0.1:0", "--bootstrap", "tcp://127.0.0.1:9",
                     "--timeout", "0.5", env={"ACTORPY_SECRET": open(secret_file).read().strip()})
        assert nobody.returncode == 1 and "no peer answered at tcp://127.0.0.1:9" in nobody.stderr
        # before: "the peer at ... answered hello but not the overlay join; try again" (exit 1)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            itself = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
        own = run("--bind", itself, "--bootstrap", itself, "--secret-file", secret_file)
        assert own.returncode == 2 and "--bootstrap is this peer's own --bind" in own.stderr
        for out in (no_secret, bad, ipv6_bind, ipv6_boot, taken, wrong, nobody, own):
            assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(20)


@pytest.mark.skipif(not os.path.isfile("/proc/self/status"), reason="needs Linux's /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_peer_stopped_while_it_joins_exits_zero(secret_file, sig):
    # before: SIGTERM killed a peer still waiting for its bootstrap peer (status -15, where
    # a supervisor expects 0 for a requested stop), and Ctrl-C gave 130
    with socket.socket() as listener:   # it accepts connections, and never answers them
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        proc = _peer(secret_file, f"tcp://127.0.0.1:{listener.getsockname()[1]}")
        try:
            wait_until(lambda: catches_signal(proc.pid, signal.SIGTERM), 30, "the peer to start")
            proc.send_signal(sig)
            assert proc.wait(15) == 0
            assert (proc.stdout.read(), proc.stderr.read()) == ("", "")
        finally:
            proc.kill()
            proc.wait(10)
            proc.stdout.close()
            proc.stderr.close()


@pytest.mark.parametrize("timeout", ["inf", "nan", "0", "-1"])
def test_a_timeout_that_never_ends_is_refused(timeout, monkeypatch):
    # before: --timeout inf was taken, and a --bootstrap that never answered held the peer
    # for ever (every other app refuses a timeout that is not finite)
    monkeypatch.delenv("ACTORPY_SECRET", raising=False)
    with pytest.raises(ConfigError, match="--timeout must be a positive number of seconds"):
        p2p_peer.main(["--bind", "tcp://127.0.0.1:0", "--bootstrap", "tcp://127.0.0.1:9",
                       "--timeout", timeout])


FAILING_PEER = """
import sys, threading
from actorpy import cli
from actorpy.runtime import loop, node

loop.FATAL_AFTER_S = 0.2
failing = threading.Event()   # every round of the I/O loop fails once the peer is ready
run_tick, on_fatal = loop.SocketLoop._run_tick, node.Node.on_fatal


def broken_tick(self):
    if failing.is_set():
        raise RuntimeError("a round that fails")
    return run_tick(self)


def watched(self, listener):
    on_fatal(self, listener)
    failing.set()
    self._loop.wake()


loop.SocketLoop._run_tick, node.Node.on_fatal = broken_tick, watched
sys.exit(cli.main(["--log-level", "ERROR", "peer", "--bind", "tcp://127.0.0.1:0",
                   "--secret-file", sys.argv[1]]))
"""


def test_a_peer_whose_io_loop_gave_up_exits_non_zero(secret_file):
    # before: status 0 (a requested stop, to a supervisor) after "this node stops (restart it)"
    out = subprocess.run([sys.executable, "-c", FAILING_PEER, secret_file], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 1, out.stderr
    assert out.stderr.splitlines()[-1].startswith("actorpy peer: the I/O loop failed for ")


DYING_SERVICE_PEER = """
import sys, threading
from actorpy import cli
from actorpy.runtime import host
from engines.peer import shell
from engines.peer.dialer import PEER_SERVICE


def end(self, run, env):   # stands for a bug that ends the peer service
    raise SystemExit("a bug")


shell.PeerService.end = end
on_service_died = host.ServiceHost.on_service_died


def watched(self, listener):   # once the peer listens, its service dies
    on_service_died(self, listener)
    def ask():
        try:
            self.node.call(self.node.node_id, PEER_SERVICE, shell.PeerKind.END, 0,
                           timeout_s=5)
        except Exception:
            pass
    threading.Thread(target=ask, daemon=True).start()


host.ServiceHost.on_service_died = watched
sys.exit(cli.main(["--log-level", "CRITICAL", "peer", "--bind", "tcp://127.0.0.1:0",
                   "--secret-file", sys.argv[1]]))
"""


def test_a_peer_whose_service_died_exits_non_zero(secret_file):
    # before: the process stayed up with a dead peer service, serving no job again, and its
    # supervisor never learned it (a job's push raising SystemExit ended the service then)
    out = subprocess.run([sys.executable, "-c", DYING_SERVICE_PEER, secret_file],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 1, out.stderr
    assert re.fullmatch(r"actorpy peer: service .* died: SystemExit: a bug",
                        out.stderr.splitlines()[-1]), out.stderr

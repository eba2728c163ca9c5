"""Failures with real processes: kill -9 of a worker, of the driver, of the manager; the CLI."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

import actorpy
from actorpy.errors import AuthError, NodeLost
from tests.conftest import alive, catches_signal, wait_until

PY = sys.executable


def test_killed_worker_is_declared_dead_and_its_task_fails():
    with actorpy.connect(workers=2, dead_after_s=1.0) as cluster:
        victim, survivor = cluster.workers()
        pid = {r["node_id"]: r["pid"] for r in cluster.nodes()}[victim]
        lost: list[str] = []
        seen = threading.Event()
        cluster.on_node_lost(lambda n: (lost.append(n), seen.set()))
        stuck = cluster.submit_to(victim, lambda: __import__("threading").Event().wait(60))
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(NodeLost) as info:
            stuck.result(timeout=10)
        detected = time.monotonic() - t0
        assert info.value.node_id == victim
        assert seen.wait(5) and lost == [victim]
        assert detected <= 3.0, f"death noticed after {detected:.2f} s"
        assert cluster.workers() == [survivor]
        assert cluster.submit(lambda: 6 * 7).result(30) == 42
        states = {r["node_id"]: r["state"] for r in cluster.nodes()}
        assert states[victim] == "dead" and states[survivor] == "alive"


DRIVER = """
import sys, time, actorpy
c = actorpy.connect(workers=2)
busy = sys.argv[1] == "busy"
if busy:  # both workers deep in a task that will not end by itself
    running = [c.submit_to(w, time.sleep, 1000) for w in c.workers()]
print(c.local.dir, " ".join(str(p) for p in c.local.pids()), flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("state", ["idle", "busy"])
def test_no_orphans_when_the_driver_is_killed(state):
    proc = subprocess.Popen([PY, "-c", DRIVER, state], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        folder, *line = proc.stdout.readline().decode().split()
        pids = [int(p) for p in line]
        assert len(pids) == 3 and all(alive(p) for p in pids)
        assert os.path.isdir(folder) and os.listdir(folder)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: not any(alive(p) for p in pids), 10,
                   "the manager and workers to exit after the driver was killed")
        # the last of them removed the socket directory (the driver could not)
        wait_until(lambda: not os.path.exists(folder), 5, f"{folder} to be removed")
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdin.close()
        proc.stdout.close()


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30):
    return subprocess.run([PY, "-m", "actorpy", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args, message", [
    (["status", "--manager", "tcp://127.0.0.1", "--timeout-s", "1"], "tcp://HOST:PORT"),
    (["status", "--manager", "ipc:///nonexistent-dir/x", "--timeout-s", "1"], "ipc directory"),
    (["worker", "--manager", "ipc:///nonexistent-dir/x"], "ipc directory"),
    (["status", "--manager", "tcp://127.0.0.1:9", "--timeout", "nan"], "--timeout"),
    (["demo", "--workers", "0"], "--workers"),
    (["secret", "--out", ""], "--out needs a file name, got an empty one"),
    # before: bound every interface and told the others to dial 0.0.0.0
    (["worker", "--manager", "tcp://127.0.0.1:9", "--host", "0.0.0.0"],
     "--host 0.0.0.0 is not an address other nodes can dial: to listen on every interface, "
     "give --bind tcp://0.0.0.0:PORT"),
    (["worker", "--manager", "tcp://127.0.0.1:9", "--host", "10.0.0.1:7401"],
     "--host must be a host name or an IPv4 address, without a port"),
    (["worker", "--manager", "tcp://127.0.0.1:9", "--bind", "0.0.0.0:7401"],
     "--bind must be tcp://HOST:PORT"),
    # before: "cannot bind tcp://203.0.113.7:*: Cannot assign requested address", no way out
    (["worker", "--manager", "tcp://127.0.0.1:9", "--host", "203.0.113.7"],
     "is 203.0.113.7 an address of this machine? To be reached there through NAT"),
])
def test_cli_refuses_bad_input_without_a_traceback(args, message):
    out = _cli(*args, env={"ACTORPY_SECRET": "a-secret-long-enough-0123"}, timeout=30)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("args", [["--log-level", "DEBG", "secret"],
                                  ["--log-level=bogus", "sgd", "--workers", "1"]])
def test_an_unknown_log_level_is_refused_before_anything_runs(args):
    out = _cli(*args)
    assert out.returncode == 2, out.stderr
    assert "argument --log-level: invalid choice" in out.stderr and out.stdout == ""
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args", [["demo", "--bogus"], ["--log-level", "DEBG", "sgd"]])
def test_a_refused_command_line_s_usage_names_the_apps_too(args):
    # before: a core command's parser, built without the apps, listed only
    # {manager,worker,status,demo,secret,sim}
    out = _cli(*args)
    assert out.returncode == 2, out.stderr
    assert "sgd" in out.stderr.split("error:")[0] and "p2p-sgd" in out.stderr, out.stderr


def test_a_log_level_is_taken_after_an_app_s_flags():
    out = _cli("sgd", "--workers", "0", "--log-level", "ERROR")
    assert out.returncode == 2 and "--workers must be at least 1" in out.stderr, out.stderr
    out = _cli("sgd", "--workers", "1", "--log-level", "BOGUS")
    assert out.returncode == 2 and "argument --log-level: invalid choice" in out.stderr


def test_a_log_level_is_taken_in_any_case():
    out = _cli("--log-level", "debug", "secret")
    assert out.returncode == 0 and len(out.stdout.strip()) >= 32, out.stderr


@pytest.mark.parametrize("args", [["secret"], ["sgd", "--workers", "1"]])
def test_an_unknown_actorpy_log_level_is_refused_unless_a_flag_overrides_it(args):
    # before: taken as WARNING, unsaid (ACTORPY_LOG_LEVEL=verbose logged nothing more)
    out = _cli(*args, env={"ACTORPY_LOG_LEVEL": "verbose"})
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert out.stderr == (f"actorpy {args[0]}: ACTORPY_LOG_LEVEL must be DEBUG, INFO, WARNING, "
                          "ERROR or CRITICAL, got 'verbose'\n")
    out = _cli("--log-level", "error", "secret", env={"ACTORPY_LOG_LEVEL": "verbose"})
    assert out.returncode == 0 and len(out.stdout.strip()) >= 32, out.stderr


def test_cli_refuses_a_secret_file_other_users_can_read(tmp_path):
    secret_file = tmp_path / "cluster.secret"
    secret_file.write_text("a-secret-long-enough-0123\n")
    secret_file.chmod(0o644)
    for args in (["worker", "--manager", "tcp://127.0.0.1:9"],
                 ["manager", "--bind", "tcp://127.0.0.1:*"]):
        out = _cli(*args, "--secret-file", str(secret_file), timeout=30)
        assert out.returncode == 2, out.stderr
        assert f"chmod 600 {secret_file}" in out.stderr and "Traceback" not in out.stderr


def test_the_hint_for_a_short_secret_file_is_a_command_that_works(tmp_path):
    # before: it said `actorpy secret --out F`, which refuses an F that exists
    secret_file = tmp_path / "my dir" / "empty.secret"
    secret_file.parent.mkdir()
    secret_file.write_text("")
    secret_file.chmod(0o600)
    for args in (["worker", "--manager", "tcp://127.0.0.1:9"],
                 ["manager", "--bind", "tcp://127.0.0.1:*"]):
        out = _cli(*args, "--secret-file", str(secret_file), timeout=30)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert "the cluster secret must be at least 16 bytes" in out.stderr
    hint = re.search(r"`([^`]*actorpy secret --out[^`]*)`", out.stderr).group(1)
    run = subprocess.run(hint.replace("actorpy secret", f"{PY} -m actorpy secret"), shell=True,
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert len(secret_file.read_text().strip()) >= 16


def test_manager_refuses_an_ipc_path_another_manager_serves(tmp_path):
    address = f"ipc://{tmp_path}/m.sock"
    first = subprocess.Popen([PY, "-m", "actorpy", "manager", "--bind", address],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip().endswith(address)
        out = _cli("manager", "--bind", address)
        assert out.returncode == 2 and "another process listens there" in out.stderr, out.stderr
        assert _cli("status", "--manager", address).returncode == 0  # still the first's
    finally:
        first.terminate()
        first.wait(10)
        first.stdout.close()


def test_manager_refuses_tcp_without_secret():
    env = {k: v for k, v in os.environ.items() if k != "ACTORPY_SECRET"}
    out = subprocess.run([PY, "-m", "actorpy", "manager", "--bind", "tcp://127.0.0.1:0"],
                         capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 2
    assert "secret" in out.stderr and "Traceback" not in out.stderr


@pytest.fixture
def tcp_manager(tmp_path):
    secret_file = tmp_path / "cluster.secret"
    made = _cli("secret", "--out", str(secret_file))
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    env = {"ACTORPY_MANAGER_TIMEOUT_S": "1.5", "ACTORPY_DEAD_AFTER_S": "1.0"}
    manager = subprocess.Popen([PY, "-m", "actorpy", "manager", "--bind", "tcp://127.0.0.1:*",
                                "--secret-file", str(secret_file)], stdout=subprocess.PIPE,
                               text=True, env={**os.environ, **env})
    line = manager.stdout.readline()
    address = line.strip().rsplit(" ", 1)[-1]
    assert address.startswith("tcp://127.0.0.1:"), line
    workers = [subprocess.Popen([PY, "-m", "actorpy", "worker", "--manager", address,
                                 "--secret-file", str(secret_file)], env={**os.environ, **env},
                                stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    yield address, secret_file, manager, workers
    for p in [*workers, manager]:
        if p.poll() is None:
            p.terminate()
    for p in [*workers, manager]:
        p.wait(10)
    manager.stdout.close()
    for w in workers:
        w.stderr.close()


def test_status_and_tcp_cluster_with_secret(tcp_manager):
    address, secret_file, manager, workers = tcp_manager

    def two_workers():
        out = _cli("status", "--manager", address, "--secret-file", str(secret_file))
        return out if out.returncode == 0 and out.stdout.count(" worker ") == 2 else None
    out = wait_until(two_workers, 20, "two workers in `actorpy status`")
    assert "2 alive, 0 gone" in out.stdout
    for w in workers:
        assert str(w.pid) in out.stdout
    # a timeout past what a lock can wait for is "no limit", not an OverflowError
    out = _cli("status", "--manager", address, "--secret-file", str(secret_file),
               "--timeout-s", "1e10")
    assert out.returncode == 0 and "2 alive" in out.stdout, out.stderr

    with actorpy.connect(address, secret_file=str(secret_file)) as cluster:
        assert len(cluster.workers()) == 2
        assert cluster.map(lambda x: x + 1, range(6), timeout_s=30) == list(range(1, 7))

    # A wrong secret is an authentication failure, said as such within seconds (not a
    # timeout): by `actorpy status`, by `actorpy worker` and by connect().
    wrong = secret_file.parent / "wrong.secret"
    wrong.write_text("not-the-cluster-secret-at-all")
    wrong.chmod(0o600)
    for command, said in ((["status", "--timeout-s", "30"], "secret differs"),
                          (["worker"], "refused this client's key: is the secret from "
                                       "--secret-file")):
        t0 = time.monotonic()
        bad = _cli(command[0], "--manager", address, "--secret-file", str(wrong), *command[1:])
        assert bad.returncode == 1 and said in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr and time.monotonic() - t0 < 15
    t0 = time.monotonic()
    with pytest.raises(AuthError, match="refused this client's key: is the secret from secret="):
        actorpy.connect(address, secret_file=str(wrong), start_timeout_s=30)
    assert time.monotonic() - t0 < 5


def _wait_for_workers(address, secret_file):
    wait_until(lambda: _cli("status", "--manager", address, "--secret-file", str(secret_file),
                            "--json").stdout.count('"worker"') == 2, 20, "workers to register")


def test_workers_exit_non_zero_when_the_manager_dies(tcp_manager):
    # before: status 0, which a supervisor (systemd, a shell loop) reads as a requested stop
    address, secret_file, manager, workers = tcp_manager
    _wait_for_workers(address, secret_file)
    manager.kill()
    manager.wait(10)
    for w in workers:
        assert w.wait(15) == 1
        lines = w.stderr.read().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"actorpy worker: lost the manager at {address}: ")
        assert lines[0].endswith("; exiting with status 1 (a supervisor may restart this worker)")


def test_a_worker_exits_non_zero_when_the_manager_restarts_without_it(tcp_manager):
    # a manager restarted on the same address does not know it: it leaves (before: with
    # status 0, so a supervisor did not start it again to join the new one). Its own
    # worker: 5 s for the new manager to start, or the link being down is what it sees.
    address, secret_file, manager, workers = tcp_manager
    _wait_for_workers(address, secret_file)
    worker = subprocess.Popen([PY, "-m", "actorpy", "worker", "--manager", address,
                               "--secret-file", str(secret_file)], stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "ACTORPY_MANAGER_TIMEOUT_S": "5"})
    again = None
    try:
        wait_until(lambda: _cli("status", "--manager", address, "--secret-file",
                                str(secret_file), "--json").stdout.count('"worker"') == 3, 20,
                   "the third worker to register")
        manager.kill()
        manager.wait(10)
        again = subprocess.Popen([PY, "-m", "actorpy", "manager", "--bind", address,
                                  "--secret-file", str(secret_file)], stdout=subprocess.PIPE,
                                 text=True)
        assert again.stdout.readline().strip().endswith(address)
        assert worker.wait(20) == 1
        assert "over a live connection (restarted since, it does not know this node;" \
            in worker.stderr.read()
    finally:
        for proc in (worker, again):
            if proc is not None:
                proc.terminate()
                proc.wait(10)
        worker.stderr.close()
        if again is not None:
            again.stdout.close()


def test_workers_stopped_on_purpose_exit_zero(tcp_manager):
    address, secret_file, manager, workers = tcp_manager
    _wait_for_workers(address, secret_file)
    workers[0].terminate()                  # SIGTERM: this worker alone
    assert workers[0].wait(15) == 0
    manager.terminate()                     # a manager stopped so tells its workers
    assert manager.wait(15) == 0
    assert workers[1].wait(15) == 0
    assert [w.stderr.read() for w in workers] == ["", ""]


def test_a_worker_listens_on_one_address_and_is_reached_at_another(tcp_manager):
    # behind NAT or in a container a worker listens on every interface and is dialled at
    # the address the others reach it at (before: --host was bound too, so a NAT's or a
    # container host's address could not be given)
    address, secret_file, manager, workers = tcp_manager
    worker = subprocess.Popen([PY, "-m", "actorpy", "worker", "--manager", address,
                               "--secret-file", str(secret_file), "--bind", "tcp://0.0.0.0:0",
                               "--host", "localhost"], stderr=subprocess.PIPE, text=True)

    def joined():
        out = _cli("status", "--manager", address, "--secret-file", str(secret_file), "--json")
        rows = json.loads(out.stdout) if out.returncode == 0 else []
        return [r for r in rows if r["pid"] == worker.pid and r["state"] == "alive"]
    try:
        row, = wait_until(joined, 20, "the worker to join")
        assert re.fullmatch(r"tcp://localhost:\d+", row["address"]), row
        with actorpy.connect(address, secret_file=str(secret_file)) as cluster:
            assert cluster.submit_to(row["node_id"], os.getpid).result(timeout=30) == worker.pid
    finally:
        worker.terminate()
        assert worker.wait(15) == 0
        assert worker.stderr.read() == ""
        worker.stderr.close()


@pytest.mark.skipif(not os.path.isfile("/proc/self/status"), reason="needs Linux's /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_stopped_while_it_joins_exits_zero(sig):
    # before: SIGTERM killed a worker still waiting for its manager (status -15, where a
    # supervisor expects 0 for a requested stop), and Ctrl-C gave 130
    with socket.socket() as listener:   # it accepts connections, and never answers them
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        proc = subprocess.Popen(
            [PY, "-m", "actorpy", "worker", "--manager",
             f"tcp://127.0.0.1:{listener.getsockname()[1]}"], stderr=subprocess.PIPE,
            text=True, env={**os.environ, "ACTORPY_SECRET": "a-secret-long-enough-0123"})
        try:
            # its handlers are set once its node dials the manager, before it joins
            wait_until(lambda: catches_signal(proc.pid, signal.SIGTERM), 30, "the worker to start")
            proc.send_signal(sig)
            assert proc.wait(15) == 0
            assert proc.stderr.read() == ""
        finally:
            proc.kill()
            proc.wait(10)
            proc.stderr.close()


STUCK_WORKER = """
import sys, threading
from actorpy import cli
from actorpy.runtime import worker
cli.CLOSE_DEADLINE_S = 1.0
worker.Worker.close = lambda self: threading.Event().wait()   # closing that never ends
sys.exit(cli.main(["worker", "--manager", sys.argv[1]]))
"""


def test_a_worker_whose_closing_hangs_still_exits():
    # before: a worker with 50,000 P2P peers on it was still closing 15 min after its
    # driver was gone, and SIGTERM did not end it
    with actorpy.connect(workers=1) as cluster:
        proc = subprocess.Popen([PY, "-c", STUCK_WORKER, cluster.local.manager_address],
                                stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": os.getcwd()})
        try:
            wait_until(lambda: len(cluster.workers()) == 2, 30, "the worker to join")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 1
            assert "still closing after 1 s; leaving without finishing" in proc.stderr.read()
        finally:
            proc.kill()
            proc.wait(10)
            proc.stderr.close()


def test_a_worker_whose_driver_went_while_it_joined_leaves_without_a_word(tmp_path):
    # before: a Ctrl-C as an embedded cluster started took the driver and its manager, and
    # each worker still joining printed "nothing is listening at ipc://..." on the terminal
    read, write = os.pipe()
    os.close(write)   # the driver is gone
    try:
        proc = subprocess.run(
            [PY, "-m", "actorpy", "worker", "--manager", f"ipc://{tmp_path}/manager",
             "--lifeline-fd", str(read)], pass_fds=(read,), capture_output=True, text=True,
            timeout=60)
    finally:
        os.close(read)
    assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.parametrize("closed", [0, 1])
def test_an_app_runs_with_stdin_or_stdout_closed(closed):
    # before: with fd 0 closed the lifeline pipe took it, each child's stdin replaced it and
    # the manager stopped at once ("nothing is listening", exit 1); with fd 1 closed the
    # JSON went to sys.stdout, None: an AttributeError traceback
    proc = subprocess.run([PY, "-m", "actorpy", "sgd", "--workers", "1", "--steps", "3",
                           "--json"], preexec_fn=lambda: os.close(closed),
                          stdout=None if closed == 1 else subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, "")
    if closed == 0:
        assert "weight_error" in proc.stdout

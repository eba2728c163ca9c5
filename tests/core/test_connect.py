"""connect() to a wrong address says what is wrong, and soon: nothing listening there, a
manager of another cluster, a listener that never answers. Loopback, in-process manager."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

import actorpy
from actorpy import apputil, cli
from actorpy.config import Config
from actorpy.errors import ActorpyTimeout, AuthError, ConfigError, NodeLost
from actorpy.ids import NodeId
from actorpy.runtime.liveness import REFUSED_GRACE_S
from actorpy.runtime.manager import Manager
from actorpy.wire.auth import Security
from tests.conftest import wait_until

SECRET = "the-cluster-secret-for-tests-0001"
OTHER_SECRET = "some-other-secret-not-the-cluster"


@pytest.fixture
def manager_address():
    manager = Manager("tcp://127.0.0.1:*", Security.curve(SECRET.encode()), Config()).start()
    yield manager.address
    manager.stop(tell_nodes=False)


@pytest.fixture
def closed_port():
    """A port nothing listens on: bound (so no one else takes it) but not listening, so
    every connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"tcp://127.0.0.1:{sock.getsockname()[1]}"


def connect_error(address: str, secret: str, start_timeout_s: float = 30.0
                  ) -> tuple[BaseException, float]:
    t0 = time.monotonic()
    with pytest.raises(actorpy.ActorpyError) as info:
        actorpy.connect(address, secret=secret, start_timeout_s=start_timeout_s)
    return info.value, time.monotonic() - t0


def test_nothing_listening_is_said_within_seconds(closed_port):
    # before: "no manager answered at ... within 30.0 s", after the full 30 s
    err, took = connect_error(closed_port, SECRET)
    assert isinstance(err, NodeLost), err
    assert f"nothing is listening at {closed_port}" in str(err)
    assert "`actorpy manager`" in str(err)
    assert took < 10.0, f"took {took:.1f} s"   # REFUSED_GRACE_S (3 s) and the close


def test_a_manager_that_binds_a_moment_after_the_driver_dials_is_joined():
    """A script may start the manager and its driver together: refused dials for less than
    REFUSED_GRACE_S are a manager still starting, not a wrong address."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    manager = None
    try:
        def late_manager() -> None:
            nonlocal manager
            manager = Manager(f"tcp://127.0.0.1:{port}", Security.curve(SECRET.encode()),
                              Config()).start()
        timer = threading.Timer(1.5, late_manager)
        timer.start()
        with actorpy.connect(f"tcp://127.0.0.1:{port}", secret=SECRET,
                             start_timeout_s=30.0) as cluster:
            assert cluster.workers() == []
        timer.join()
    finally:
        if manager is not None:
            manager.stop(tell_nodes=False)


def test_an_embedded_clusters_worker_waits_longer_for_its_manager_to_listen():
    """A worker of an embedded cluster dials a manager starting beside it: on a loaded
    machine its interpreter took longer than REFUSED_GRACE_S to bind, and the worker (and
    connect()) said "nothing is listening" (seen under a load of 40-50 on 2 cores)."""
    from actorpy.runtime.worker import Worker

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    worker = Worker("w-patient", f"tcp://127.0.0.1:{port}", "tcp://127.0.0.1:*",
                    Security.curve(SECRET.encode()), Config(), embedded=True)
    manager = None
    started = threading.Event()

    def late_manager() -> None:   # binds the closed port once the grace has gone by
        nonlocal manager
        manager = Manager(f"tcp://127.0.0.1:{port}", Security.curve(SECRET.encode()),
                          Config()).start()
        started.set()

    timer = threading.Timer(REFUSED_GRACE_S + 1.0, late_manager)
    try:
        timer.start()
        worker.start(30.0)
        assert started.is_set()
    finally:
        timer.cancel()
        worker.stop()
        worker.close()
        if manager is not None:
            manager.stop(tell_nodes=False)


def test_a_manager_with_another_secret_is_said_within_seconds(manager_address):
    err, took = connect_error(manager_address, OTHER_SECRET)
    assert isinstance(err, AuthError), err
    assert f"the manager at {manager_address} refused this client's key" in str(err)
    # the library names connect()'s parameters, the command line its flag
    assert "secret=/secret_file=" in str(err) and "--secret-file" not in str(err)
    assert "--secret-file" in apputil.error_line(err)
    assert "secret=/secret_file=" not in apputil.error_line(err)
    assert took < 5.0, f"took {took:.1f} s"


def test_a_listener_that_never_answers_times_out():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        err, took = connect_error(address, SECRET, start_timeout_s=2.0)
    assert isinstance(err, ActorpyTimeout), err
    assert f"no manager answered at {address} within 2.0 s" in str(err)


def test_status_against_a_listener_that_never_answers_says_what_to_check(tmp_path, capsys):
    # before: "status on manager got no reply within 1.0 s; raise the timeout_s, or check
    # the node's log": no flag of that name, and no log to check
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.monotonic()
        path = tmp_path / "cluster.secret"
        path.write_text(SECRET)
        path.chmod(0o600)
        assert cli.main(["status", "--manager", address, "--secret-file", str(path),
                         "--timeout-s", "1"]) == 1
        assert time.monotonic() - t0 < 5.0
    said = capsys.readouterr().err
    assert f"no answer from {address} within 1 s: is `actorpy manager` running there" in said
    assert "longer --timeout" in said and "timeout_s" not in said


@pytest.mark.parametrize("level", ["LOUD", 3, ""])
def test_a_log_level_that_is_none_is_refused(level):
    # before: connect(log_level="LOUD") was taken, its children logging at their default
    with pytest.raises(ConfigError, match="log_level must be DEBUG, INFO, WARNING, ERROR or "
                                          "CRITICAL"):
        actorpy.connect(workers=1, log_level=level)


def test_an_unknown_actorpy_log_level_is_refused_by_an_embedded_cluster(monkeypatch):
    # before: taken as WARNING by each child, unsaid
    monkeypatch.setenv("ACTORPY_LOG_LEVEL", "loud")
    with pytest.raises(ConfigError, match="ACTORPY_LOG_LEVEL must be DEBUG, INFO, WARNING, "
                                          "ERROR or CRITICAL, got 'loud'"):
        actorpy.connect(workers=1)


def test_a_script_that_ends_without_terminate_leaves_and_is_not_taken_for_killed():
    # before: its manager listed it as dead, "the process was killed, stopped or cut off"
    manager = Manager("tcp://127.0.0.1:*", Security.curve(SECRET.encode()), Config()).start()
    try:
        script = ("import actorpy\n"
                  f"c = actorpy.connect({manager.address!r}, secret={SECRET!r})\n"
                  "print(c.node_id, flush=True)\n")   # and falls off the end
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        record = manager.records[NodeId(out.stdout.strip())]
        wait_until(lambda: record.state in ("left", "dead"), 30, "the driver gone")
        assert (record.state, record.reason) == ("left", "left the cluster")
    finally:
        manager.stop(tell_nodes=False)


def test_the_right_secret_still_connects(manager_address):
    with actorpy.connect(manager_address, secret=SECRET) as cluster:
        assert [r["role"] for r in cluster.nodes()] == ["driver"]


def test_a_missing_secret_is_asked_for_in_the_callers_terms(monkeypatch, capsys):
    monkeypatch.delenv("ACTORPY_SECRET", raising=False)
    with pytest.raises(ConfigError) as info:
        actorpy.connect("tcp://127.0.0.1:1")
    assert "give it with secret=/secret_file= (or ACTORPY_SECRET)" in str(info.value)
    assert "--secret-file" not in str(info.value)
    assert cli.main(["status", "--manager", "tcp://127.0.0.1:1"]) == 2
    said = capsys.readouterr().err
    assert "give it with --secret-file (or ACTORPY_SECRET)" in said and "secret=" not in said


def test_an_unreadable_secret_file_is_named_as_the_caller_gave_it(tmp_path, capsys):
    # before: "cannot read --secret-file F" from connect(secret_file=F) too
    missing = tmp_path / "no.secret"
    with pytest.raises(ConfigError, match=f"cannot read secret_file {missing}: "):
        actorpy.connect("tcp://127.0.0.1:1", secret_file=str(missing))
    assert cli.main(["status", "--manager", "tcp://127.0.0.1:1",
                     "--secret-file", str(missing)]) == 2
    assert f"cannot read --secret-file {missing}: " in capsys.readouterr().err


def test_a_worker_that_could_not_join_a_listener_speaking_http_closes_at_once():
    """Before: a worker pointed at a non-actorpy listener that keeps the connection open
    (an HTTP server) timed out joining, then hung in close() sending its goodbye to the
    "manager" over a link that never completes its handshake; `actorpy worker` was killed by
    its own 10 s closing guard, and the "no manager answered" line was never printed."""
    from actorpy.runtime.address import node_bind
    from actorpy.runtime.worker import Worker

    held: list[socket.socket] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.1)
        address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        done = threading.Event()

        def serve() -> None:
            while not done.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nhello")
                held.append(conn)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        worker = Worker("w-http", address, node_bind(address, "w-http"),
                        Security.curve(SECRET.encode()), Config())
        try:
            with pytest.raises(ActorpyTimeout, match=f"no manager answered at {address}"):
                worker.start(1.0)
            worker.stop()
            closer = threading.Thread(target=worker.close, daemon=True)
            t0 = time.monotonic()
            closer.start()
            closer.join(8.0)
            assert not closer.is_alive(), "Worker.close() hung"
            assert time.monotonic() - t0 < 5.0
        finally:
            done.set()
            server.join(5.0)
            for conn in held:
                conn.close()


def test_a_worker_the_manager_cannot_reach_back_is_told_so(manager_address):
    # a --host that is not where the worker can be reached (a typo, a firewall, NAT): the
    # manager's answer never came, and the worker said "no manager answered at ...; is
    # `actorpy manager` running there?" of a manager that had taken its registration
    from actorpy.runtime.worker import Worker

    worker = Worker("w-far", manager_address, "tcp://127.0.0.1:*",
                    Security.curve(SECRET.encode()), Config(), host="127.0.0.2")
    try:
        with pytest.raises(ActorpyTimeout, match=(
                f"{manager_address} took this worker's connection \\(it holds the cluster "
                r"secret\) but did not answer its registration within 3.0 s: a manager "
                r"answers by connecting back to tcp://127.0.0.2:\d+, so check that the "
                "manager's machine can reach that address")):
            worker.start(3.0)
    finally:
        worker.stop()
        worker.close()


def test_every_option_of_the_core_commands_says_what_it_is():
    # before: `actorpy status --help` listed --manager, --secret-file and --timeout-s bare,
    # and `actorpy demo --help` its --workers
    parser = cli.build_parser(with_apps=False)
    commands = next(a for a in parser._actions if a.dest == "command").choices
    bare = [f"{name} {'/'.join(a.option_strings)}"
            for name, sub in commands.items() if name in cli.CORE_COMMANDS
            for a in sub._actions if a.option_strings and not a.help]
    assert bare == []


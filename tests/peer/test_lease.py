"""A standalone peer's job is leased to its driver: a driver gone (SIGKILL, closed without
END, between JOB and START too) loses its job after the lease and the peers take the next
one; a driver that is alive but busy keeps it, and so does its job."""
from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

from actorpy.barrier import PSP
from actorpy.config import Config
from actorpy.errors import RemoteError
from actorpy.ids import NodeId
from actorpy.runtime.context import ServiceRef
from actorpy.runtime.node import Node
from actorpy.wire import auth
from actorpy.wire.auth import Security
from engines.peer.dialer import PEER_SERVICE, Dialer
from engines.peer.overlay_run import OverlayClient
from engines.peer.runner import Phase
from engines.peer.shell import DRIVER_LEASE_S, LEASE_CHECKS, PeerKind
from tests.apps.test_p2p_peer import _first_line, _endpoint
from tests.conftest import wait_until
from tests.peer.linreg import NAMES, init, linreg, shard, weight_error
from tests.peer.test_standalone import SECRET, _peer

ROOT = pathlib.Path(__file__).resolve().parents[2]
LEASE_S = 0.5           # the in-process peers' lease: short, so the tests are quick
#: a driver that runs a job with no stop of its own, and says so once every peer stepped
DRIVER = """
import dataclasses
import sys
from actorpy.barrier import PSP
from tests.peer.linreg import init, linreg, shard

said = []
def say_running(run, seconds):
    if not said and len(run.last) == 3 and min(s["step"] for s in run.last.values()) >= 2:
        said.append(run.cluster.node.node_id)
        print("running", said[0], flush=True)
job = linreg(PSP(sample=1, staleness=1), steps=2**62)
job.config = dataclasses.replace(job.config, rpc_timeout_s=0.5)   # a loaded machine
job.run_overlay(sys.argv[1], init(), secret_file=sys.argv[2], data=shard, timeout_s=600,
                on_poll=say_running)
"""


def _ended(records, driver: str) -> list[str]:
    return [r.getMessage() for r in records if r.levelno == logging.WARNING
            and "ended job 'linreg'" in r.getMessage() and driver in r.getMessage()]


@pytest.fixture(scope="module")
def leased():
    peers = [_peer(lease_s=LEASE_S)]
    try:
        peers += [_peer(peers[0].endpoint, lease_s=LEASE_S) for _ in range(2)]
        wait_until(lambda: all(len(p.status()["table"]) == 2 for p in peers), 10,
                   "the three peers to know each other")
        yield peers
    finally:
        for p in peers:
            p.close()


def _refs(client: OverlayClient, endpoints: list[str]) -> list[ServiceRef]:
    """The peers at ``endpoints``, each said hello to once (not the members crawl: under
    load its 2 s hellos may miss one; and a second hello from the same node loses the
    MEMBERS answers, the ROUTER's hand-over of its connection, a known bug)."""
    return [ServiceRef(w.node_id, PEER_SERVICE)
            for w in client.dialer.hello_all(endpoints, 10).values()]


def _submit(client: OverlayClient, refs: list[ServiceRef], run: int) -> None:
    """JOB (not START) to every peer: a job that never stops on its own."""
    job = linreg(PSP(sample=1, staleness=1), steps=2**62)
    spec = dataclasses.replace(job.spec(init()), run=run)
    for i, ref in enumerate(refs):
        client.call(ref, PeerKind.JOB, (spec, job.config, i, shard))


class TestLeaseInProcess:
    def test_a_busy_driver_keeps_its_job(self, leased, caplog):
        with OverlayClient(leased[0].endpoint, secret=SECRET) as client:
            refs = _refs(client, [p.endpoint for p in leased])
            _submit(client, refs, run=11)
            try:
                client.call(refs[0], PeerKind.SEED, init())
                wait_until(lambda: all(client.call(refs[0], PeerKind.GET, n) for n in NAMES),
                           10, "the seed on its holders")
                for ref in refs:
                    client.call(ref, PeerKind.START, False)
                wait_until(lambda: all(p.status()["step"] >= 2 for p in leased), 10,
                           "every peer to step")
                before = [p.status()["step"] for p in leased]
                # The driver's own I/O thread stuck for 4 leases (as in a long C call holding
                # its GIL): no Python of the driver runs, its main thread waits too.
                stuck, busy_s = threading.Event(), 4 * LEASE_S

                def busy() -> None:
                    stuck.set()
                    threading.Event().wait(busy_s)
                client.node.call_later(0, busy)
                assert stuck.wait(5)
                with caplog.at_level(logging.WARNING, logger="engines.peer.shell"):
                    threading.Event().wait(busy_s)
                    statuses = [client.call(ref, PeerKind.STATUS) for ref in refs]
                assert all(s["phase"] in (Phase.WORKING, Phase.BARRIER) for s in statuses)
                assert sum(s["step"] for s in statuses) > sum(before)   # and it went on
                assert _ended(caplog.records, client.node.node_id) == []
            finally:
                ended = [client.call(ref, PeerKind.END, 11) for ref in refs]
        assert ended == [True] * 3        # its own runner, never dropped and replaced

    def test_a_driver_gone_between_job_and_start_frees_the_peers(self, leased, caplog):
        first = OverlayClient(leased[1].endpoint, secret=SECRET)
        with OverlayClient(leased[2].endpoint, secret=SECRET) as second:
            refs = _refs(second, [p.endpoint for p in leased])
            try:
                _submit(first, _refs(first, [p.endpoint for p in leased]), run=21)
                with pytest.raises(RemoteError, match=r"for another driver \(d-\w+: connected"):
                    _submit(second, refs, run=22)      # the first one holds its lease
                driver = first.node.node_id
                with caplog.at_level(logging.WARNING, logger="engines.peer.shell"):
                    closed = time.monotonic()
                    first.close()                      # no END: gone, as on SIGKILL
                    wait_until(lambda: len(_ended(caplog.records, driver)) == 3,
                               LEASE_S * (1 + 1 / LEASE_CHECKS) + 5, "the lease to lapse")
                    freed_s = time.monotonic() - closed
                    _submit(second, refs, run=22)      # taken at once
                assert LEASE_S <= freed_s < LEASE_S + 3
                # one WARNING per peer, naming the job and the driver
                assert len({m.split()[1] for m in _ended(caplog.records, driver)}) == 3
            finally:
                first.close()
                for ref in refs:
                    second.call(ref, PeerKind.END, 22)

    def test_a_new_driver_at_a_dead_ones_endpoint_voids_its_lease(self, caplog):
        # the dead driver's port taken by the next one: the peer's link to the dead one,
        # redialled, is up again, to the new one; without the rule it would hold for ever
        peer = _peer(lease_s=60)
        try:
            first = OverlayClient(peer.endpoint, secret=SECRET)
            try:
                _submit(first, _refs(first, [peer.endpoint]), run=31)
                endpoint, dead = first.node.address, first.node.node_id
            finally:
                first.close()
            node = Node.from_config(NodeId("d-next"), endpoint, Security.curve(SECRET.encode()),
                                    Config.from_env()).start()
            try:
                Dialer(node, endpoint).hello(peer.endpoint, 10)
                # the new driver's claim of the endpoint makes the peer forget the dead one
                # (before: its link, redialled, was up again, to the new one)
                wait_until(lambda: not peer.dialer.knows(dead), 10, "the dead driver replaced")
                with caplog.at_level(logging.WARNING, logger="engines.peer.shell"):
                    job = linreg(PSP(sample=1, staleness=1), steps=1)
                    spec = dataclasses.replace(job.spec(init()), run=32)
                    node.call(peer.node_id, PEER_SERVICE, PeerKind.JOB,
                              (spec, job.config, 0, shard), timeout_s=10)
                [message] = _ended(caplog.records, dead)
                assert "d-next now listens at its endpoint" in message
                assert node.call(peer.node_id, PEER_SERVICE, PeerKind.END, 32, timeout_s=10)
            finally:
                node.close(linger_ms=0)
        finally:
            peer.close()


@pytest.fixture
def secret_file(tmp_path):
    path = str(tmp_path / "cluster.secret")
    auth.write_secret_file(path, auth.generate_secret())
    return path


def _members(endpoint: str, secret_file: str) -> int:
    with OverlayClient(endpoint, secret_file=secret_file) as client:
        return len(client.members())


def _process(args: list[str], log_path: pathlib.Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log_path, "w") as stderr:
        return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                                stderr=stderr, text=True, cwd=ROOT, env=env)


def test_a_killed_drivers_job_ends_on_the_peers_and_the_next_job_runs(secret_file, tmp_path):
    """Three ``actorpy peer`` processes; a driver with a job that never stops is SIGKILLed
    once every peer stepped; within the lease the peers end its job on their own (before:
    they ran it for ever and refused every JOB), and a new job runs to its result."""
    logs = [tmp_path / f"peer{i}.log" for i in range(3)]
    peer = ["-m", "actorpy", "peer", "--bind", "tcp://127.0.0.1:0", "--secret-file",
            secret_file]
    procs = [_process(peer, logs[0])]
    driver = None
    try:
        endpoints = [_endpoint(procs[0])]
        procs += [_process(peer + ["--bootstrap", endpoints[0]], log) for log in logs[1:]]
        endpoints += [_endpoint(p) for p in procs[1:]]
        wait_until(lambda: _members(endpoints[0], secret_file) == 3, 20, "the peers to meet")
        driver = _process(["-c", DRIVER, endpoints[1], secret_file], tmp_path / "driver.log")
        line = _first_line(driver, 60)
        assert line.startswith("running "), (line, (tmp_path / "driver.log").read_text())
        driver_id = line.split()[1]
        killed = time.monotonic()
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)

        with OverlayClient(endpoints[2], secret_file=secret_file) as client:
            refs = _refs(client, endpoints)
            wait_until(lambda: all(client.call(r, PeerKind.STATUS)["step"] == 0 for r in refs),
                       DRIVER_LEASE_S * (1 + 1 / LEASE_CHECKS) + 10, "the peers to end the job")
            freed_s = time.monotonic() - killed
        # a loaded machine: the driver's crawl may miss a peer (its hellos wait 2 s)
        wait_until(lambda: _members(endpoints[2], secret_file) == 3, 20, "the peers to meet")
        job = linreg(PSP(sample=2, staleness=1), steps=40)
        job.config = dataclasses.replace(job.config, rpc_timeout_s=0.5)
        result = job.run_overlay(endpoints[2], init(), secret_file=secret_file, data=shard,
                                 timeout_s=60)
        assert DRIVER_LEASE_S <= freed_s < DRIVER_LEASE_S + 5
        assert sorted(result.steps.values()) == [40] * 3
        assert all(3 * 40 <= c <= 3 * 40 + 2 for c in result.clocks.values())  # from clock 0
        assert weight_error(result.model) < 0.05
        for log in logs:    # each peer said once which job it ended, and whose
            ended = [x for x in log.read_text().splitlines()
                     if "ended job 'linreg'" in x and driver_id in x]
            assert len(ended) == 1, log.read_text()
    finally:
        for proc in procs + ([driver] if driver is not None else []):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in procs + ([driver] if driver is not None else []):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_a_bad_driver_lease_is_a_one_line_error(secret_file):
    out = subprocess.run([sys.executable, "-m", "actorpy", "peer", "--bind", "tcp://127.0.0.1:0",
                          "--secret-file", secret_file, "--driver-lease", "0"],
                         capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert out.returncode == 2 and "--driver-lease must be" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr

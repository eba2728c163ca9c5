"""The embedded local cluster's processes: the socket directory goes with the last of them,
a forked child of the driver does not keep the cluster alive, workers join mid-run, a
script started with a standard stream closed still runs one."""
from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys

import pytest

import actorpy
from actorpy.errors import ActorpyError, ConfigError
from actorpy.runtime.local import hold_cluster_dir, leave_cluster_dir
from actorpy.wire.auth import private_dir
from tests.conftest import alive, wait_until


class TestLastOneOut:
    def test_only_the_last_holder_removes_the_directory(self):
        folder = private_dir()
        holders = [hold_cluster_dir(folder) for _ in range(3)]
        folder_file = os.path.join(folder, "socket")
        open(folder_file, "w").close()
        assert [leave_cluster_dir(folder, fd) for fd in holders[:2]] == [False, False]
        assert os.path.isfile(folder_file)
        assert leave_cluster_dir(folder, holders[2]) is True
        assert not os.path.exists(folder)

    def test_a_closed_cluster_removes_its_directory(self):
        with actorpy.connect(workers=1) as cluster:
            folder = cluster.local.dir
            assert os.path.isdir(folder)
        assert not os.path.exists(folder)


FORK_DRIVER = """
import multiprocessing, os, select, sys, actorpy
c = actorpy.connect(workers=1)

def linger():
    c.terminate()                   # a child's terminate must leave the driver's cluster be
    select.select([], [], [], 60)   # outlive the driver
    os._exit(0)

quitter = os.fork()
if quitter == 0:
    sys.exit(0)                     # a normal exit runs the child's copy of the finalizers
assert os.waitpid(quitter, 0)[1] == 0
if sys.argv[1] == "os.fork":
    child = os.fork()
    if child == 0:
        linger()
else:
    proc = multiprocessing.get_context("fork").Process(target=linger)
    proc.start()
    child = proc.pid
assert c.submit(pow, 2, 5).result(30) == 32, "the forked children broke the cluster"
print(child, c.local.dir, *c.local.pids(), flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("how", ["os.fork", "multiprocessing"])
def test_a_forked_child_does_not_keep_the_clusteralive(how):
    proc = subprocess.Popen([sys.executable, "-c", FORK_DRIVER, how], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
    child = None
    try:
        line = proc.stdout.readline().decode().split()
        assert len(line) == 4, f"the driver failed (exit {proc.wait(10)})"
        child, folder, pids = int(line[0]), line[1], [int(p) for p in line[2:]]
        assert alive(child) and all(alive(p) for p in pids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: not any(alive(p) for p in pids), 10,
                   "the cluster to exit although a forked child of the driver lives on")
        wait_until(lambda: not os.path.exists(folder), 5, f"{folder} to be removed")
        assert alive(child)
    finally:
        proc.kill()
        proc.wait(10)
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)
        proc.stdin.close()
        proc.stdout.close()


class TestAddWorkers:
    def test_workers_join_mid_run_and_take_tasks(self):
        with actorpy.connect(workers=1) as cluster:
            first = cluster.workers()
            new = cluster.add_workers(2, timeout_s=60)
            assert len(new) == 2 and not set(new) & set(first)
            assert sorted(cluster.workers()) == sorted(first + new)
            pids = {r["node_id"]: r["pid"] for r in cluster.nodes()}
            assert {w: cluster.submit_to(w, os.getpid).result(30) for w in new} == \
                {w: pids[w] for w in new}
            assert {pids[w] for w in new} <= set(cluster.local.pids())
            assert cluster.map(lambda x: x * 3, range(9), timeout_s=60) == \
                [x * 3 for x in range(9)]
            with pytest.raises(ConfigError, match="n >= 1"):
                cluster.add_workers(0)

    def test_bad_arguments_start_no_process(self, monkeypatch):
        with actorpy.connect(workers=1) as cluster:
            started = []
            monkeypatch.setattr(cluster.local, "add_workers",
                                lambda n: started.append(n) or [])
            # 1.5 and "1" failed as a TypeError, True started one worker; past the embedded
            # cluster's cap (its manager's sockets) connect() refused, add_workers started them
            for n in (1.5, "1", True):
                with pytest.raises(ConfigError, match=re.escape(
                        f"add_workers needs an int n >= 1, not {n!r}")):
                    cluster.add_workers(n)
            with pytest.raises(ConfigError, match="at most 256 workers, not 257"):
                cluster.add_workers(256)
            with pytest.raises(ConfigError, match="timeout_s must be a number of seconds"):
                cluster.add_workers(1, timeout_s=math.nan)
            assert started == []

    def test_a_remote_cluster_says_how_to_add_workers(self):
        with actorpy.connect(workers=1) as local:
            address = local.local.manager_address
            with actorpy.connect(address) as remote:
                with pytest.raises(ActorpyError) as info:
                    remote.add_workers(1)
                assert f"actorpy worker --manager {address}" in str(info.value)
                assert remote.workers() == local.workers()


CLOSED_STREAM_DRIVER = """
import os, sys, actorpy
with actorpy.connect(workers=1) as c:
    answer = c.submit(lambda: (print("a task's print"), 2 ** 10)[1]).result(timeout=30)
os.write(int(sys.argv[1]), str(answer).encode())
"""


@pytest.mark.parametrize("start", ["auto", "spawn"])
@pytest.mark.parametrize("closed", [0, 1, 2])
def test_a_script_with_a_standard_stream_closed_runs_a_cluster(closed, start):
    # before (spawned children): with fd 0 closed the lifeline pipe took it and each
    # child's stdin replaced it (the manager stopped at once: "nothing is listening"); with
    # fd 1 closed a worker's stdout was the lifeline's read end, where a task's print failed
    read, write = os.pipe()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CLOSED_STREAM_DRIVER, str(write)], pass_fds=(write,),
            preexec_fn=lambda: os.close(closed), capture_output=closed != 2, timeout=60,
            env={**os.environ, "PYTHONPATH": os.getcwd(), "ACTORPY_LOCAL_START": start})
        os.close(write)
        write = -1
        assert proc.returncode == 0, proc.stderr
        assert os.read(read, 100) == b"1024"
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)

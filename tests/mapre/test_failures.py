"""Real processes killed with SIGKILL mid-job: lost map outputs and cached partitions are
recomputed from lineage and every answer matches plain Python.

The user functions here leave a marker file per partition they start (so the test knows
what ran where) and wait at a gate (a file the test creates) so that the kill lands while
the job is provably still running."""
from __future__ import annotations

import collections
import operator
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import actorpy
from engines import mapre
from tests.conftest import alive, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STOP = frozenset(
    "a are is in it that this and to of so will can which for on an with the -".split())
VOCAB = ["the", "The", "cat", "Käse", "naïve", "e\u0301t\u00e9", "日本", "-", "of", "zebra",
         "Sat", "mat", "über", "a", "quick", "brown", "fox"]


def _corpus(path: Path, lines: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8", newline="") as f:
        for i in range(lines):
            words = rng.choices(VOCAB, k=rng.randint(1, 14))
            f.write(" ".join(words) + ("\r\n" if i % 5 == 0 else "\n"))


def _pid_of(cluster, worker) -> int:
    return {r["node_id"]: r["pid"] for r in cluster.nodes()}[worker]


def _marks(folder: Path, prefix: str = "", pid: int | None = None) -> int:
    return sum(1 for name in os.listdir(folder) if name.startswith(prefix)
               and (pid is None or name.split("-")[1] == str(pid)))


def _mark_and_gate(folder: Path, prefix: str, free: int):
    """A partition function: leave a marker; past the first ``free`` partitions of this
    worker, wait for the test's ``go`` file (at most 60 s) before reading the partition."""
    def run(items):
        (folder / f"{prefix}-{os.getpid()}-{uuid.uuid4().hex}").touch()
        if _marks(folder, prefix, os.getpid()) > free:
            gate = threading.Event()
            for _ in range(6000):
                if (folder / "go").exists():
                    break
                gate.wait(0.01)
        return items
    return run


def _run_in_thread(fn):
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test thread
            box["error"] = exc
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def _result(thread, box, timeout_s: float):
    thread.join(timeout_s)
    assert not thread.is_alive(), "the job did not finish"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _expected_counts(corpus) -> collections.Counter:
    """Word counts of ``corpus`` as the pipelines below count them, in one process."""
    return collections.Counter(
        w for line in corpus.read_text(encoding="utf-8").splitlines()
        for w in map(str.lower, line.split()) if w not in STOP)


def _wordcount_setup(tmp_path: Path, seed: int) -> tuple[Path, Path, collections.Counter]:
    """A 60 000-line corpus, an empty marks directory, and the corpus's expected counts."""
    corpus = tmp_path / "corpus.txt"
    _corpus(corpus, 60_000, seed=seed)
    marks = tmp_path / "marks"
    marks.mkdir()
    return corpus, marks, _expected_counts(corpus)


class TestWorkerKilled:
    def test_wordcount_with_a_worker_killed_mid_job_equals_counter(self, tmp_path):
        corpus, marks, expected = _wordcount_setup(tmp_path, seed=7)
        with actorpy.connect(workers=2, dead_after_s=1.0) as cluster:
            victim = cluster.workers()[0]
            pid = _pid_of(cluster, victim)
            counts = (mapre.load(cluster, str(corpus), split_bytes=64 << 10)
                      .map_partitions(_mark_and_gate(marks, "M", free=1))
                      .flat_map(str.split).map(str.lower).filter(lambda w: w not in STOP)
                      .map(lambda w: (w, 1)).reduce_by_key(operator.add))
            partitions = counts.partitions
            thread, box = _run_in_thread(lambda: counts.collect(timeout_s=90))
            wait_until(lambda: _marks(marks, "M", pid) >= 2, 30,
                       "the victim to finish one partition and start another")
            os.kill(pid, signal.SIGKILL)
            (marks / "go").touch()
            got = _result(thread, box, 90)
            assert cluster.workers() != [] and victim not in cluster.workers()
        assert dict(got) == expected and len(got) == len(expected)
        assert _marks(marks, "M") > partitions  # the victim's partitions ran again

    def test_reduce_by_key_locally_with_a_worker_killed_counts_each_partition_once(self, tmp_path):
        # partitions the driver has already merged stay merged; the victim's others run again
        corpus, marks, expected = _wordcount_setup(tmp_path, seed=11)
        with actorpy.connect(workers=2, dead_after_s=1.0) as cluster:
            victim = cluster.workers()[0]
            pid = _pid_of(cluster, victim)
            words = (mapre.load(cluster, str(corpus), split_bytes=64 << 10)
                     .map_partitions(_mark_and_gate(marks, "L", free=2))
                     .flat_map(str.split).map(str.lower).filter(lambda w: w not in STOP)
                     .map(lambda w: (w, 1)))
            partitions = words.partitions
            thread, box = _run_in_thread(
                lambda: words.reduce_by_key_locally(operator.add, timeout_s=90))
            wait_until(lambda: _marks(marks, "L", pid) >= 3, 30,
                       "the victim to finish two partitions and start a third")
            os.kill(pid, signal.SIGKILL)
            (marks / "go").touch()
            got = _result(thread, box, 90)
            assert victim not in cluster.workers()
        assert got == dict(expected)
        assert _marks(marks, "L") > partitions  # the victim's unfinished partitions ran again

    def test_reducers_fetching_from_a_dead_worker_recover(self, tmp_path):
        marks = tmp_path / "marks"
        marks.mkdir()
        with actorpy.connect(workers=2, dead_after_s=1.0) as cluster:
            victim, survivor = cluster.workers()
            data = mapre.from_items(cluster, range(20_000), partitions=8)
            spread = data.map(lambda x: x * 2).shuffle(4).map_partitions(
                _mark_and_gate(marks, "R", free=0))
            thread, box = _run_in_thread(lambda: spread.collect(timeout_s=90))
            wait_until(lambda: _marks(marks, "R", _pid_of(cluster, survivor)) >= 1, 30,
                       "a reducer on the survivor to wait at the gate")
            os.kill(_pid_of(cluster, victim), signal.SIGKILL)
            (marks / "go").touch()
            got = _result(thread, box, 90)
        assert sorted(got) == [x * 2 for x in range(20_000)]
        assert _marks(marks, "R") > 4  # reducers ran again after their inputs were rebuilt

    def test_cached_partitions_of_a_killed_worker_are_recomputed(self, tmp_path):
        marks = tmp_path / "marks"
        marks.mkdir()
        with actorpy.connect(workers=2, dead_after_s=1.0) as cluster:
            cached = (mapre.from_items(cluster, range(3000), partitions=6)
                      .map_partitions(_mark_and_gate(marks, "C", free=10**6))
                      .map(lambda x: x * x).cache())
            assert cached.count(timeout_s=60) == 3000 and cached.is_cached
            assert _marks(marks, "C") == 6
            victim = cluster.workers()[0]
            held = sum(1 for node, _ in cached._node.locations.values() if node == victim)
            assert held > 0
            os.kill(_pid_of(cluster, victim), signal.SIGKILL)
            wait_until(lambda: victim not in cluster.workers(), 10, "the driver to hear of it")
            assert cached.collect(timeout_s=60) == [x * x for x in range(3000)]
            assert _marks(marks, "C") == 6 + held  # only the lost partitions were recomputed
            assert cached.is_cached
            assert cached.map(lambda x: x % 7).distinct().count(timeout_s=60) == \
                len({x * x % 7 for x in range(3000)})
            assert _marks(marks, "C") == 6 + held

    def test_collect_resumes_when_a_holder_of_unread_results_dies(self, tmp_path):
        marks = tmp_path / "marks"
        marks.mkdir()
        with actorpy.connect(workers=2, dead_after_s=1.0) as cluster:
            d = (mapre.from_items(cluster, range(30_000), partitions=6)
                 .map_partitions(_mark_and_gate(marks, "S", free=10**6)).map(lambda x: x + 1))
            stream = d.iterate(timeout_s=90)
            got = [next(stream)]  # every partition is computed and stored; reading has begun
            assert _marks(marks, "S") == 6
            os.kill(_pid_of(cluster, cluster.workers()[0]), signal.SIGKILL)
            got.extend(stream)
        assert got == [x + 1 for x in range(30_000)]
        assert _marks(marks, "S") > 6  # unread partitions of the dead worker were recomputed


INTERRUPTED_DRIVER = """
import os, sys, threading, actorpy
from engines import mapre

def stuck(x):  # leaves a marker, then waits (up to 60 s) for a gate that never opens
    open(os.path.join(sys.argv[1], f"{x}-{os.getpid()}"), "w").close()
    threading.Event().wait(60)
    return x

with actorpy.connect(workers=2) as cluster:
    print(" ".join(str(r["pid"]) for r in cluster.nodes()), flush=True)
    mapre.from_items(cluster, range(6), 6).map(stuck).count(timeout_s=120)
"""


class TestInterrupted:
    def test_ctrl_c_mid_job_ends_the_driver_at_once(self, tmp_path):
        # Ctrl-C must not wait for tasks that run on (up to 10 s) nor for deletes queued
        # behind them (up to 5 s); the embedded cluster goes with the driver.
        script = tmp_path / "driver.py"
        script.write_text(INTERRUPTED_DRIVER)
        marks = tmp_path / "marks"
        marks.mkdir()
        proc = subprocess.Popen([sys.executable, str(script), str(marks)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": ROOT})
        try:
            pids = [int(p) for p in proc.stdout.readline().split()]
            wait_until(lambda: len(os.listdir(marks)) >= 2, 30, "both workers to start a task")
            started = time.monotonic()
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
            took = time.monotonic() - started
        finally:
            proc.kill()
        assert "KeyboardInterrupt" in err and took < 5, (took, err[-2000:])
        assert len(os.listdir(marks)) == 2  # the queued partitions never started
        wait_until(lambda: not any(alive(p) for p in pids), 30, "the cluster's processes to end")


def test_a_function_that_kills_its_worker_is_named():
    # os._exit (or a crash in C) takes each worker down in turn; the error must say which
    # partition was running, not only that no worker is left
    def fatal(x):
        if x == 3:
            os._exit(1)
        return x
    with actorpy.connect(workers=1, dead_after_s=1.0) as cluster:
        with pytest.raises(mapre.JobFailed) as info:
            mapre.from_items(cluster, range(4), 4).map(fatal).collect(timeout_s=60)
    assert "no live workers left" in str(info.value)
    # the one worker may run several partitions at once: partition 3 is among those named
    named = re.search(r"ran partitions? ([\d, ]+) of stage 'collect'", str(info.value))
    assert named and "3" in named.group(1).split(", "), str(info.value)


def test_a_lost_manager_is_named_first():
    # the workers go with the manager; "no live workers left" alone sent users looking for
    # dead workers
    with actorpy.connect(workers=2, dead_after_s=1.0) as cluster:
        workers = {n["pid"] for n in cluster.nodes() if n["role"] == "worker"}
        [manager] = [p for p in cluster.local.pids() if p not in workers]

        def kill_the_manager(x):
            if x == 0:
                os.kill(manager, signal.SIGKILL)
            threading.Event().wait()    # until the worker, which lost its manager, exits
            return x
        with pytest.raises(mapre.JobFailed) as info:
            mapre.from_items(cluster, range(40), 40).map(kill_the_manager).collect(timeout_s=60)
    assert "the cluster's manager is gone" in str(info.value), str(info.value)

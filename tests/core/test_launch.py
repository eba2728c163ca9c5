"""How the embedded cluster starts its processes (runtime/launch.py): forked from a driver
with a single thread, spawned otherwise; either way a worker killed with SIGKILL is noticed,
the rest go on, and nothing outlives the driver."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import alive, wait_until

PY = sys.executable

DRIVER = """
import os, signal, sys, threading, time, actorpy
print("buffered before connect")  # stdout is a pipe: held in the buffer when the fork comes
if sys.argv[1] == "thread":
    threading.Thread(target=threading.Event().wait, daemon=True).start()
c = actorpy.connect(workers=2, dead_after_s=1.0)
pids = c.local.pids()
names = [open(f"/proc/{p}/comm").read().strip() for p in pids]
lines = [open(f"/proc/{p}/cmdline", "rb").read().replace(b"\\0", b" ").decode() for p in pids]
victim, survivor = c.workers()
pid = {r["node_id"]: r["pid"] for r in c.nodes()}[victim]
lost = threading.Event()
c.on_node_lost(lambda n: n == victim and lost.set())
os.kill(pid, signal.SIGKILL)
assert lost.wait(10), "the killed worker was not declared lost"
assert c.workers() == [survivor]
assert c.submit(pow, 2, 10).result(30) == 1024
exited = c.local.exited([victim])
print("RESULT", c.local.dir, " ".join(map(str, pids)), exited[victim], "|".join(names),
      "|".join(lines), sep="\\t", flush=True)
c.terminate()
"""


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-c", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.getcwd(), **(env or {})})


@pytest.mark.parametrize("how", ["fork", "spawn", "thread"])
def test_a_killed_worker_is_lost_and_nothing_outlives_the_driver(how):
    env = {"ACTORPY_LOCAL_START": "spawn"} if how == "spawn" else {}
    out = _run(DRIVER, how, env=env)
    assert out.returncode == 0, out.stderr
    # printed once: a forked child did not write the driver's buffered output again
    assert out.stdout.splitlines().count("buffered before connect") == 1
    result = next(line for line in out.stdout.splitlines() if line.startswith("RESULT"))
    _, folder, pids, code, names, lines = result.split("\t")
    assert int(code) == -9  # the victim's status, as Popen reports a SIGKILL
    if how == "fork":  # a single-threaded driver forks: the children carry its command line
        assert names.split("|") == ["actorpy-manager", "actorpy-worker", "actorpy-worker"]
        assert not any(" -m actorpy " in line for line in lines.split("|"))
    else:  # told to spawn, or a thread running: fresh interpreters
        assert [" -m actorpy manager " in lines.split("|")[0]] + [
            " -m actorpy worker " in line for line in lines.split("|")[1:]] == [True] * 3
    wait_until(lambda: not any(alive(int(p)) for p in pids.split()), 10,
               "every process of the cluster to exit with the driver")
    assert not os.path.exists(folder)


FAILING_MANAGER = """
import os, sys
from actorpy.errors import ActorpyError
from actorpy.runtime import launch
assert launch.fork_is_safe()
try:
    launch.fork(["manager", "--bind", "ipc:///nonexistent-dir/x"], dict(os.environ), (),
                ready_timeout_s=30)
except ActorpyError as exc:
    print("ERROR", exc, flush=True)
"""


def test_a_forked_manager_that_fails_is_reported_not_waited_for():
    out = _run(FAILING_MANAGER)
    assert out.returncode == 0, out.stderr
    assert "ERROR the local manager exited before it was ready (exit status 2)" in out.stdout
    assert "ipc directory" in out.stderr and "Traceback" not in out.stderr


HELD_PIPE = """
import os, select, actorpy
r, w = os.pipe()  # the driver's: say, a pipe to a subprocess of its own
with actorpy.connect(workers=1) as c:
    assert c.submit(pow, 2, 3).result(30) == 8
    os.close(w)
    ready = select.select([r], [], [], 10)[0]
    print("EOF" if ready and os.read(r, 1) == b"" else "HELD", flush=True)
"""


def test_forked_children_hold_none_of_the_drivers_descriptors():
    out = _run(HELD_PIPE)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["EOF"]  # no cluster process kept the write end open


ABOVE_THE_LIMIT = """
import os, resource, actorpy
high = os.dup2(os.open(os.devnull, os.O_RDONLY), 200)   # held from before a lower ulimit -n
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
with actorpy.connect(workers=1) as c:
    print("RESULT", c.submit(pow, 2, 3).result(30), flush=True)
"""


def test_a_descriptor_above_the_open_files_limit_does_not_stop_a_fork():
    # before: dup2(/dev/null, 200) failed with EBADF in every forked child ("the local
    # manager exited before it was ready"): a shell's `ulimit -n 64` with a higher
    # descriptor inherited (an ssh session's, a test harness's)
    out = _run(ABOVE_THE_LIMIT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["RESULT", "8"]


FORKED_CHILD = """
import os, signal, subprocess
from actorpy.runtime import launch
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(r, 1)
    os._exit(3)
child = launch.ForkedChild(pid)
assert child.poll() is None
try:
    child.wait(0.2)
    raise AssertionError("wait returned while the child was still running")
except subprocess.TimeoutExpired:
    pass
os.write(w, b"x")
assert child.wait(30) == 3 and child.poll() == 3
pid = os.fork()
if pid == 0:
    os.read(r, 1)
    os._exit(0)
killed = launch.ForkedChild(pid)
killed.kill()
print("CODES", child.returncode, killed.wait(30), flush=True)
"""


def test_forked_child_waits_polls_and_kills_like_popen():
    out = _run(FORKED_CHILD)
    assert out.returncode == 0, out.stderr
    assert "CODES 3 -9" in out.stdout


def test_local_start_is_checked():
    import actorpy
    from actorpy.errors import ConfigError

    with pytest.raises(ConfigError, match="local_start"):
        actorpy.connect(workers=1, local_start="forkserver")

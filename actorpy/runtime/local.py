"""The embedded local cluster: a manager and N worker processes on this machine, reachable
only by this user, gone when the driver goes (even if the driver is killed with SIGKILL).

Every child holds the read end of a pipe (the *lifeline*) whose write end only the driver
holds. When the driver exits for any reason the kernel closes it, the children read EOF and
leave. A process the driver forks (without exec) closes its copy at once, so it cannot keep
the cluster alive after the driver. The endpoints are ``ipc://`` sockets in a fresh 0700
directory; where ipc is not available, 127.0.0.1 with CURVE and a fresh random secret.

The directory goes with the last process of the cluster. Each child holds a shared
``flock`` on it, taken by the driver before the child starts (so none is missed); on the way
out each drops its lock and tries for an exclusive one: only the last one gets it, and it
removes the directory. A driver that closes the cluster removes it too, once its children
are gone. The driver takes no lock of its own: when it is SIGKILLed the kernel may release
its files some milliseconds after the children see the lifeline close, and a lock of the
driver's could then make every child believe it is not the last.
"""
from __future__ import annotations

import fcntl
import functools
import logging
import os
import random
import shutil
import subprocess
import sys
import time
import weakref

import zmq

from actorpy.config import Config
from actorpy.errors import ActorpyError, ConfigError
from actorpy.ids import NodeId, new_node_id
from actorpy.runtime import launch
from actorpy.wire.auth import Security, generate_secret, private_dir

log = logging.getLogger(__name__)

_IPC_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep room for the node's file name


#: the variables that size the thread pools of BLAS libraries and OpenMP (numpy, torch)
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def blas_threads(workers: int) -> int:
    """The BLAS/OpenMP threads each of ``workers`` processes gets: its share of the cores
    this process may run on. Each library otherwise starts a thread per core in every
    process, and the workers' threads then fight over the cores: a worker waiting on a
    message spins its idle BLAS threads while another's matrix product waits for a core
    (a 0.6 ms numpy step took 1-80 ms with 2 workers on 2 cores). Dask's workers and
    torchrun set such a share for the same reason."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    return max(1, cores // max(1, workers))


class LocalCluster:
    """Start the processes of a local cluster (the driver then joins it like any node).

    Args:
        workers: number of worker processes.
        config: passed to every child through ``ACTORPY_*`` variables.
        log_level: children's log level (default: ``ACTORPY_LOG_LEVEL`` or WARNING).
    """

    def __init__(self, workers: int, config: Config, log_level: str | None = None) -> None:
        launch.fill_standard_fds()  # before the lifeline pipe, which could take a free 0-2
        self.workers = workers
        self._pid = os.getpid()
        self._rng = random.Random(int.from_bytes(os.urandom(8), "big"))
        self.dir = private_dir()
        self._lifeline_r = self._lifeline_w = -1
        self.procs: list[launch.Child] = []
        self._workers: dict[NodeId, launch.Child] = {}
        ipc_ok = zmq.has("ipc") and len(self.dir) < _IPC_PATH_MAX
        if config.local_transport == "ipc" and not ipc_ok:
            self.close()
            raise ConfigError("local_transport='ipc' but ipc is not available here "
                              f"(libzmq without ipc, or the path {self.dir} is too long)")
        use_ipc = ipc_ok and config.local_transport != "tcp"
        self.secret: bytes | None = None
        if use_ipc:
            self.manager_address = f"ipc://{self.dir}/manager"
            self.security = Security.ipc()
        else:
            self.secret = generate_secret().encode()
            self.manager_address = _free_tcp_endpoint()
            self.security = Security.curve(self.secret)
        self._lifeline_r, self._lifeline_w = os.pipe()
        os.register_at_fork(after_in_child=functools.partial(_forked, weakref.ref(self)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        for field, value in vars(config).items():
            if value is not None:
                env[f"ACTORPY_{field.upper()}"] = str(value)
        if config.store_dir is None:  # spill files live and die with the cluster's directory
            env["ACTORPY_STORE_DIR"] = self.dir
        if self.secret is not None:
            env["ACTORPY_SECRET"] = self.secret.decode()
        if log_level:
            env["ACTORPY_LOG_LEVEL"] = log_level
        share = str(blas_threads(workers))
        for var in THREAD_VARS:             # unless the user chose: see blas_threads
            env.setdefault(var, share)
        self._env = env
        self._start_mode = config.local_start
        try:
            self.procs.append(self._spawn(["manager", "--bind", self.manager_address],
                                          ready_timeout_s=config.start_timeout_s))
            self.add_workers(workers)
        except BaseException:
            self.close()
            raise

    def add_workers(self, n: int) -> list[NodeId]:
        """Start ``n`` more worker processes; returns their ids (they register by themselves:
        wait for them in the directory)."""
        ids = [new_node_id(self._rng, "w") for _ in range(n)]
        for node_id in ids:
            proc = self._spawn(["worker", "--manager", self.manager_address,
                                "--node-id", node_id])
            self.procs.append(proc)
            self._workers[node_id] = proc
        return ids

    @property
    def worker_ids(self) -> list[NodeId]:
        """Ids of the workers this cluster started, in order."""
        return list(self._workers)

    def exited(self, node_ids: list[NodeId]) -> dict[NodeId, int]:
        """The exit status of each of these workers whose process has already exited."""
        return {n: code for n in node_ids if (code := self._workers[n].poll()) is not None}

    def bind_for(self, node_id: str) -> str:
        """The endpoint a node of this cluster (the driver) should bind."""
        if self.security.mode == "ipc":
            return f"ipc://{self.dir}/{node_id}"
        return "tcp://127.0.0.1:*"

    def _spawn(self, args: list[str], ready_timeout_s: float | None = None) -> launch.Child:
        """Start one process: forked while the driver has a single thread, else a fresh
        interpreter (runtime/launch.py). A forked one is waited for until ready when
        ``ready_timeout_s`` is given (a spawned one is not: starting the interpreters side
        by side saves more than the manager's head start would)."""
        if self._lifeline_w < 0:
            raise ActorpyError("this local cluster is closed; connect() a new one")
        launch.fill_standard_fds()  # one the driver closed since: see there
        try:
            hold = hold_cluster_dir(self.dir)  # the child's own lock, taken before it starts
        except OSError as exc:
            raise ActorpyError(f"this local cluster has ended ({self.dir}: {exc.strerror}); "
                               "connect() a new one") from None
        lifeline = -1
        try:
            if not launch.use_fork(self._start_mode):
                return launch.spawn([*args, "--lifeline-fd", str(self._lifeline_r),
                                     "--cluster-dir", self.dir, "--cluster-dir-fd", str(hold)],
                                    self._env, (self._lifeline_r, hold))
            # A copy of the read end: the fork hook (_forked) closes the child's original.
            lifeline = os.dup(self._lifeline_r)
            return launch.fork([*args, "--forked", "--lifeline-fd", str(lifeline), "--cluster-dir",
                                self.dir, "--cluster-dir-fd", str(hold)], self._env,
                               (lifeline, hold), ready_timeout_s=ready_timeout_s)
        finally:
            os.close(hold)
            if lifeline >= 0:
                os.close(lifeline)

    def not_up(self, timeout_s: float) -> str:
        """Why connect() could not join this cluster's manager, for its error."""
        code = self.procs[0].poll() if self.procs else None
        fate = "it is still starting" if code is None else f"it exited with status {code}"
        return (f"the embedded cluster's manager did not answer within start_timeout_s="
                f"{timeout_s:g} s ({fate}); on a loaded machine give it longer, e.g. "
                "ACTORPY_START_TIMEOUT_S=120")

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def close(self, timeout_s: float = 5.0) -> None:
        """Cut the lifeline, wait for the children (killing stragglers), remove the directory.
        Does nothing in a forked child of the process that started the cluster."""
        if os.getpid() != self._pid:
            return
        self._close_fds()
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            try:
                proc.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("process %d did not exit in time; killing it", proc.pid)
                proc.kill()
                proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _close_fds(self) -> None:
        for fd in (self._lifeline_w, self._lifeline_r):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._lifeline_w = self._lifeline_r = -1

    def _forked(self) -> None:
        """In a forked child: let go of the lifeline, so that the cluster still ends with
        the driver, and own none of its processes."""
        self._close_fds()
        self.procs, self._workers = [], {}


def _forked(ref: weakref.ref[LocalCluster]) -> None:
    cluster = ref()
    if cluster is not None:
        cluster._forked()


def hold_cluster_dir(path: str) -> int:
    """Open ``path`` and take a shared lock on it: one more process of the cluster is alive.
    The returned descriptor is not inherited across exec (pass it explicitly)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


def leave_cluster_dir(path: str, fd: int) -> bool:
    """Let go of the lock taken by ``hold_cluster_dir``; the last process to leave removes
    the directory. Returns whether this one did.

    Each leaving process drops its shared lock, then tries for an exclusive one without
    waiting: that succeeds only when no process of the cluster holds a lock, and the
    process whose try comes last always succeeds (every other one has dropped its lock by
    then), so the directory never outlives them and never goes before them."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    else:
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def _free_tcp_endpoint() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"

"""The embedded local cluster: a manager and N worker processes on this machine, reachable
only by this user, gone when the driver goes (even if the driver is killed with SIGKILL).

Every child holds the read end of a pipe (the *lifeline*) whose write end only the driver
holds. When the driver exits for any reason the kernel closes it, the children read EOF and
leave. The endpoints are ``ipc://`` sockets in a fresh 0700 directory; where ipc is not
available, 127.0.0.1 with CURVE and a fresh random secret.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time

import zmq

from actorpy.config import Config
from actorpy.errors import ConfigError
from actorpy.wire.auth import Security, generate_secret, private_dir

log = logging.getLogger(__name__)

_IPC_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep room for the node's file name


class LocalCluster:
    """Start the processes of a local cluster (the driver then joins it like any node).

    Args:
        workers: number of worker processes.
        config: passed to every child through ``ACTORPY_*`` variables.
        log_level: children's log level (default: ``ACTORPY_LOG_LEVEL`` or WARNING).
    """

    def __init__(self, workers: int, config: Config, log_level: str | None = None) -> None:
        self.workers = workers
        self.dir = private_dir()
        ipc_ok = zmq.has("ipc") and len(self.dir) < _IPC_PATH_MAX
        if config.local_transport == "ipc" and not ipc_ok:
            shutil.rmtree(self.dir, ignore_errors=True)
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
        common = ["--lifeline-fd", str(self._lifeline_r)]
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            self.procs.append(self._spawn(
                ["manager", "--bind", self.manager_address, *common], env))
            for _ in range(workers):
                self.procs.append(self._spawn(
                    ["worker", "--manager", self.manager_address, *common], env))
        except BaseException:
            self.close()
            raise
        os.close(self._lifeline_r)

    def bind_for(self, node_id: str) -> str:
        """The endpoint a node of this cluster (the driver) should bind."""
        if self.security.mode == "ipc":
            return f"ipc://{self.dir}/{node_id}"
        return "tcp://127.0.0.1:*"

    def _spawn(self, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "actorpy", *args], env=env,
                                pass_fds=(self._lifeline_r,), stdin=subprocess.DEVNULL,
                                start_new_session=True)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def close(self, timeout_s: float = 5.0) -> None:
        """Cut the lifeline, wait for the children (killing stragglers), remove the directory."""
        for fd in (self._lifeline_w, self._lifeline_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._lifeline_w = self._lifeline_r = -1
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            try:
                proc.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("process %d did not exit in time; killing it", proc.pid)
                proc.kill()
                proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


def _free_tcp_endpoint() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"

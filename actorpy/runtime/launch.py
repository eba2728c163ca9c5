"""How the embedded local cluster starts its processes: forked from the driver where that is
safe, else as fresh interpreters (``python -m actorpy manager|worker ...``).

A fresh interpreter pays for its start-up and its imports (zmq, cloudpickle, the runtime:
about 0.2 s of CPU each, three of them for ``connect(workers=2)``); a fork starts with the
driver's modules already loaded, in a few milliseconds. Forking is safe only while the driver
has a single thread: another thread's locks (a zmq I/O thread's, a logging handler's held
mid-write) would be copied into the child held, for good. So ``connect()`` forks when the
process has exactly one thread, the usual case for a script or an app that connects first,
and spawns otherwise (a second cluster while the first still runs, ``add_workers``, a driver
that started threads). ``Config.local_start="spawn"`` always spawns.

A forked child drops the driver's fork-inherited identity before it runs the same
``actorpy.cli`` entry point a spawned one runs: its name (``actorpy-worker`` in ``ps -o
comm``; its command line stays the driver's), a new session (as ``start_new_session``),
none of the driver's descriptors but stdout and stderr (stdin is /dev/null), default signal
handlers, the cluster's environment, no logging
handlers of the driver's, numpy's global random state reseeded; it leaves with
``os._exit``, so none of the driver's atexit handlers or finalizers run there.
"""
from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
import weakref
from typing import NoReturn, Protocol

from actorpy.errors import ActorpyError, ActorpyTimeout


class Child(Protocol):
    """What the local cluster needs of a child process (``subprocess.Popen`` has it)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


def fork_is_safe() -> bool:
    """Whether this process may fork a cluster process now: Linux (a pidfd to wait on the
    child) and a single thread in the whole process, native threads included."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def use_fork(mode: str) -> bool:
    """Whether to fork under ``Config.local_start``: "auto" forks where it is safe,
    "spawn" never does."""
    return mode == "auto" and fork_is_safe()


def fill_standard_fds() -> list[int]:
    """Point whichever of descriptors 0, 1 and 2 is closed at /dev/null; returns those.

    A process started with one closed (``python script.py <&-``, a daemon's) would else
    hand that number to the cluster's next pipe or socket (the lowest free one): a lifeline
    read from fd 0, which a spawned child's stdin replaces (its manager stops at once), or
    a child whose stdout is the driver's pipe, where a task's ``print`` fails."""
    filled = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)   # the lowest free number: ``fd``
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            filled.append(fd)
    return filled


def spawn(argv: list[str], env: dict[str, str], fds: tuple[int, ...]) -> Child:
    """``python -m actorpy *argv`` in a new session, keeping only ``fds`` open."""
    return subprocess.Popen([sys.executable, "-m", "actorpy", *argv], env=env, pass_fds=fds,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def fork(argv: list[str], env: dict[str, str], fds: tuple[int, ...], *,
         ready_timeout_s: float | None = None) -> ForkedChild:
    """Fork a child that runs ``actorpy.cli.main(argv)`` with ``env`` as its environment,
    keeping ``fds`` (and stdout, stderr) open: every other descriptor it inherited is
    pointed at /dev/null (see ``_release_inherited``). The caller checked
    ``fork_is_safe()``.

    With ``ready_timeout_s`` the child also gets ``--ready-fd N`` and this returns once it
    wrote there (the manager: its socket is bound, so nobody who connects next meets a
    refused connection and libzmq's 100 ms reconnect interval).

    Raises:
        ActorpyError: the child exited before it was ready.
        ActorpyTimeout: it was not ready within ``ready_timeout_s``.
    """
    import actorpy.cli  # noqa: F401 - loaded once here, shared by every child
    import actorpy.runtime.manager  # noqa: F401
    import actorpy.runtime.worker  # noqa: F401

    _flush_std()  # or the child would write the buffered text again
    ready_r = ready_w = -1
    if ready_timeout_s is not None:
        ready_r, ready_w = os.pipe()
        argv = [*argv, "--ready-fd", str(ready_w)]
        fds = (*fds, ready_w)
    pid = os.fork()
    if pid == 0:
        _child_main(argv, env, fds)
    child = ForkedChild(pid)
    if ready_timeout_s is not None:
        os.close(ready_w)
        try:
            _wait_ready(ready_r, child, argv[0], ready_timeout_s)
        except BaseException:
            child.kill()  # not left to run unowned
            child.wait(5.0)
            raise
        finally:
            os.close(ready_r)
    return child


def _wait_ready(fd: int, child: ForkedChild, what: str, timeout_s: float) -> None:
    if not select.select([fd], [], [], timeout_s)[0]:
        raise ActorpyTimeout(f"the local {what} was not ready within {timeout_s} s")
    if not os.read(fd, 1):
        try:
            code = child.wait(5.0)
        except subprocess.TimeoutExpired:
            code = None
        raise ActorpyError(f"the local {what} exited before it was ready (exit status "
                           f"{code}); its error is on this process's stderr")


def tell_ready(fd: int | None) -> None:
    """In a child given ``--ready-fd``: say it is ready (see ``fork``)."""
    if fd is not None:
        os.write(fd, b"1")
        os.close(fd)


def _release_inherited(keep: tuple[int, ...]) -> None:
    """Point every inherited descriptor but stdout, stderr and ``keep`` at /dev/null.

    A spawned child closes them (``close_fds``); a forked one must not hold them either: a
    copy of a pipe's write end held by the cluster would keep its reader from ever seeing
    end-of-file (a test's subprocess waiting on its stdin, a parent waiting on the driver's
    output). They are not closed but replaced, so that each number stays taken: a Python
    object of the driver's that owns one may still close it when it is collected here,
    and must not close a socket of the child's that got the same number."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd in (1, 2, null) or fd in keep:
                continue
            try:
                os.fstat(fd)  # the listing's own descriptor is gone already
            except OSError:
                continue
            try:
                os.dup2(null, fd)
            except OSError:   # at or above RLIMIT_NOFILE (inherited from before a lower
                os.close(fd)  # ulimit -n): no descriptor of ours can take its number
    finally:
        os.close(null)


def _child_main(argv: list[str], env: dict[str, str], keep: tuple[int, ...]) -> NoReturn:
    code = 1
    try:
        try:  # what `ps` and `top` show, as the driver's command line is still this one's
            with open("/proc/self/comm", "w") as comm:
                comm.write(f"actorpy-{argv[0]}"[:15])
        except OSError:
            pass
        os.setsid()
        _release_inherited(keep)  # stdin among them
        for sig in signal.valid_signals():
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(env)
        root = logging.getLogger()
        for handler in root.handlers[:]:  # not closed: the driver's buffers are the driver's
            root.removeHandler(handler)
        numpy = sys.modules.get("numpy")
        if numpy is not None:  # each worker its own legacy global stream, as when spawned
            numpy.random.seed()
        from actorpy.cli import main

        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        _flush_std()
        os._exit(code)


def _flush_std() -> None:
    """Flush stdout and stderr, whatever they are (closed, replaced, None)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass


class ForkedChild:
    """A forked child, waited on through a pidfd (no polling loop); ``Popen``'s
    ``returncode`` convention (``-N``: killed by signal N)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)
        # one reaper at a time: the cluster's close waits while the I/O thread may poll (a
        # worker declared dead). Only ``wait`` closes the pidfd (or the object's end), so a
        # wait selecting on it never finds it closed (or its number reused) by a poll
        self._lock = threading.Lock()
        self._close_pidfd = weakref.finalize(self, os.close, self._pidfd)

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status, once the child has exited.

        Raises:
            subprocess.TimeoutExpired: it is still running after ``timeout`` seconds."""
        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            self._reap(0)
        assert self.returncode is not None
        self._close_pidfd()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def _reap(self, flags: int) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler): status unknown
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)

    def __repr__(self) -> str:
        return f"<ForkedChild pid={self.pid} returncode={self.returncode}>"

"""``actorpy`` command line: manager, worker, status, demo, sim, secret, and the apps.

Apps add their own subcommands through the ``actorpy.apps`` entry-point group (name ->
``module:main`` taking ``argv`` and returning an exit status), so the core names no app.
The only place logging is configured (``--log-level`` > ``ACTORPY_LOG_LEVEL`` > WARNING).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import select
import signal
import sys
import threading
from typing import Any, Sequence

from actorpy import log as alog
from actorpy.config import Config
from actorpy import apputil
from actorpy.errors import ActorpyError, ActorpyTimeout, ConfigError
from actorpy.ids import new_node_id
from actorpy.runtime.address import check_host, node_bind, security_for, worker_bind
from actorpy.runtime import launch
from actorpy.runtime.membership import IO_FAILED, MANAGER_GONE
from actorpy.runtime.worker import DRIVER_GONE
from actorpy.wire import auth


def _serve_until_stopped(stopped: threading.Event, lifeline_fd: int | None, node: Any,
                         stop: Any) -> None:
    if lifeline_fd is not None:
        node.watch_fd(lifeline_fd, lambda: stop(DRIVER_GONE))

    def on_signal(signum: int, frame: Any) -> None:
        signal.signal(signum, signal.SIG_DFL)  # a second signal ends the process outright
        stop("signal")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    while not stopped.wait(0.5):
        pass


def _leave_local_cluster(args: argparse.Namespace) -> None:
    """A process of an embedded local cluster: the last one to go removes its directory."""
    if args.cluster_dir_fd is not None:
        from actorpy.runtime.local import leave_cluster_dir

        leave_cluster_dir(args.cluster_dir, args.cluster_dir_fd)


def cmd_manager(args: argparse.Namespace) -> int:
    from actorpy.runtime.manager import Manager

    security = security_for(args.bind, secret_file=args.secret_file)
    manager = Manager(args.bind, security, Config.from_env()).start()
    launch.tell_ready(args.ready_fd)
    if args.lifeline_fd is None:
        print(f"actorpy manager listening at {manager.address}", flush=True)
    _serve_until_stopped(manager.stopped, args.lifeline_fd, manager.node,
                         lambda reason: manager.stop(tell_nodes=reason == "signal"))
    _leave_local_cluster(args)
    if manager.failure:  # its I/O loop gave up: exit non-zero so a supervisor restarts it
        manager.node.close()
        print(f"actorpy manager: {manager.failure}", file=sys.stderr)
        return 1
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from actorpy.runtime.worker import Worker

    if not args.forked:
        _preload_numpy()
    config = Config.from_env(task_threads=args.threads)
    security = security_for(args.manager, secret_file=args.secret_file)
    node_id = args.node_id or new_node_id(random.Random(int.from_bytes(os.urandom(8), "big")), "w")
    try:
        worker = Worker(node_id, args.manager, _worker_bind(args, node_id), security, config,
                        host=args.host, embedded=args.lifeline_fd is not None)
    except ConfigError as exc:
        if args.host is None or args.bind is not None or not str(exc).startswith("cannot bind"):
            raise
        said = str(exc).partition("; ")[0]   # the node's own hint is the question below
        raise ConfigError(f"{said}; is {args.host} an address of this machine? To be reached "
                          "there through NAT or a container's published port, listen with "
                          "--bind tcp://0.0.0.0:PORT (a port forwarded to this machine "
                          f"under the same number) and keep --host {args.host}") from None
    joining = [True]

    def on_signal(signum: int, frame: Any) -> None:
        signal.signal(signum, signal.SIG_DFL)  # a second signal ends the process outright
        worker.stop("signal")
        if joining[0]:   # the join waits up to start_timeout_s: stop waiting for it
            joining[0] = False
            raise _StopWhileJoining
    for sig in (signal.SIGINT, signal.SIGTERM):   # SIGTERM last: caught means both are
        signal.signal(sig, on_signal)
    try:
        try:
            try:
                worker.start(config.start_timeout_s)
            finally:
                joining[0] = False
        except _StopWhileJoining:   # before: SIGTERM killed it (-15), Ctrl-C gave 130
            pass
        except ActorpyError:
            if not _driver_gone(args.lifeline_fd):
                raise
            # its driver stopped (a Ctrl-C as the cluster started) and took the manager with
            # it: nobody waits for this worker, and "nothing is listening" would mislead
            worker.stop(DRIVER_GONE)
        else:
            _serve_until_stopped(worker.stopped, args.lifeline_fd, worker.node, worker.stop)
    finally:
        worker.stop()
        _leave_if_stuck(args, CLOSE_DEADLINE_S)
        worker.close()
    _leave_local_cluster(args)
    # A task may still be running in a thread that cannot be interrupted; the worker's job
    # is over, so leave now rather than wait for it (no orphan outlives its cluster).
    code = _worker_status(worker.stop_reason, args.lifeline_fd)
    logging.shutdown()
    os._exit(code)


class _StopWhileJoining(BaseException):
    """SIGTERM or Ctrl-C while a worker still joins its manager: it stops as a worker that
    joined does (status 0). A BaseException, as KeyboardInterrupt, so no ``except
    Exception`` on the way swallows it."""


def _worker_bind(args: argparse.Namespace, node_id: str) -> str:
    """Where a worker listens: ``--bind``, else the ``--host`` it is reached at, else the
    address that routes to the manager (any free port)."""
    if args.host is not None:
        check_host(args.host)
    if args.bind is None:
        return node_bind(args.manager, node_id, args.host)
    if args.manager.startswith("ipc://"):
        raise ConfigError("--bind is for a tcp cluster: a worker of an ipc manager listens "
                          "beside it")
    return worker_bind(args.bind)


#: a worker's exit status when its manager went without a word (killed, its host lost):
#: not 0, which a supervisor (systemd, a shell loop, Kubernetes) reads as a requested stop
MANAGER_LOST_STATUS = 1


def _worker_status(reason: str, lifeline_fd: int | None) -> int:
    """A stopping worker's exit status: 0 for a requested stop (a signal, the manager's
    SHUTDOWN, an embedded cluster's driver gone), 1 when its own I/O loop failed or its
    manager was lost (said in one line on stderr)."""
    if reason.startswith(IO_FAILED):
        return 1
    if reason.startswith(MANAGER_GONE) and not _driver_gone(lifeline_fd):
        # an embedded cluster's worker has no supervisor: its driver says what was lost
        hint = "" if lifeline_fd is not None else " (a supervisor may restart this worker)"
        print(f"actorpy worker: {reason}; exiting with status {MANAGER_LOST_STATUS}{hint}",
              file=sys.stderr, flush=True)
        return MANAGER_LOST_STATUS
    return 0


def _driver_gone(lifeline_fd: int | None) -> bool:
    """Whether an embedded cluster's driver is gone: its lifeline pipe, never written to,
    reads as closed (readable at once)."""
    if lifeline_fd is None:
        return False
    try:
        return bool(select.select([lifeline_fd], [], [], 0)[0])
    except (OSError, ValueError):
        return True


#: How long a stopping worker may take to close before it leaves without finishing: with a
#: P2P job's 50,000 peers on it, a worker whose driver was gone was still closing 15 min on.
CLOSE_DEADLINE_S = 10.0


def _leave_if_stuck(args: argparse.Namespace, after_s: float) -> None:
    """Exit the process (status 1) if it is still here ``after_s`` from now: no worker
    outlives its cluster, however its closing goes."""
    def leave() -> None:
        print(f"actorpy worker: still closing after {after_s:g} s; leaving without finishing",
              file=sys.stderr, flush=True)
        _leave_local_cluster(args)
        os._exit(1)
    timer = threading.Timer(after_s, leave)
    timer.daemon = True
    timer.start()


def _preload_numpy() -> None:
    """Load numpy before joining, as most workers' tasks need it: a first task should not
    wait for its import (0.1-0.5 s) while the other workers' tasks already run. Not in a
    worker forked from a driver that had not loaded it (runtime/launch.py): that driver's
    tasks seldom need it, and its cluster starts in milliseconds."""
    try:
        import numpy  # noqa: F401
    except ImportError:
        pass


#: drivers that left cleanly shown by `actorpy status` (the latest; `--json` has them all)
SHOWN_LEFT_DRIVERS = 5


def cmd_status(args: argparse.Namespace) -> int:
    from actorpy.errors import AuthError
    from actorpy.runtime.membership import MANAGER_ID
    from actorpy.runtime.node import Node
    from actorpy.wire.kinds import CORE_SERVICE, Kind

    if not (math.isfinite(args.timeout_s) and args.timeout_s > 0):
        raise ConfigError("--timeout must be a positive number of seconds")
    security = security_for(args.manager, secret_file=args.secret_file)
    node_id = new_node_id(random.Random(int.from_bytes(os.urandom(8), "big")), "s")
    node = Node(node_id, node_bind(args.manager, node_id), security, linger_ms=0).start()
    try:
        node.add_peer(MANAGER_ID, args.manager, "manager", watch=True)
        # a lock's wait takes at most TIMEOUT_MAX (~292 years), past it an OverflowError
        rows = node.call(MANAGER_ID, CORE_SERVICE, Kind.LIST_NODES, {"address": node.address},
                         timeout_s=min(args.timeout_s, threading.TIMEOUT_MAX), what="status")
    except AuthError as exc:
        print(f"actorpy status: {exc}", file=sys.stderr)
        return 1
    except ActorpyTimeout:   # was "...; raise the timeout_s, or check the node's log"
        print(f"actorpy status: no answer from {args.manager} within {args.timeout_s:g} s: is "
              "`actorpy manager` running there (and not stopped)? A loaded one may need a "
              "longer --timeout", file=sys.stderr)
        return 1
    except ActorpyError as exc:
        print(f"actorpy status: no answer from {args.manager}: {exc}", file=sys.stderr)
        return 1
    finally:
        node.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    alive = sum(r["state"] in ("joining", "alive", "suspect") for r in rows)
    print(f"manager {args.manager}: {alive} alive, {len(rows) - alive} gone")
    print(f"{'NODE':<16} {'ROLE':<8} {'STATE':<6} {'HOST':<16} {'PID':>7} {'HEARTBEAT':>10}  "
          "ADDRESS")
    # one driver per job leaves a "left" row: a standing cluster's thousand of them hid the
    # rows an operator looks for (dead members, their reasons); the latest few are shown
    left = sorted((r for r in rows if r["role"] == "driver" and r["state"] == "left"),
                  key=lambda r: r.get("joined_at", 0))
    hidden = {id(r) for r in left[:-SHOWN_LEFT_DRIVERS]}
    shown = [r for r in rows if id(r) not in hidden]
    for r in sorted(shown, key=lambda r: (r["state"] != "alive", r["role"], r["node_id"])):
        age = f"{r['heartbeat_age_s']:.1f}s ago"
        why = f"  ({r['reason']})" if r["reason"] else ""
        print(f"{r['node_id']:<16} {r['role']:<8} {r['state']:<6} {r['host'][:16]:<16} "
              f"{r['pid']:>7} {age:>10}  {r['address']}{why}")
    if hidden:
        print(f"... and {len(hidden)} more drivers that left cleanly ({len(left)} in all; "
              "`--json` lists every row)")
    return 0


def cmd_secret(args: argparse.Namespace) -> int:
    if args.out is not None:  # `--out "$UNSET"` must not print the secret for all to see
        if not args.out.strip():   # it said "cannot create : No such file or directory"
            raise ConfigError("--out needs a file name, got an empty one (an unset variable?)")
        auth.write_secret_file(args.out, auth.generate_secret())
        print(f"wrote a fresh cluster secret to {args.out} (mode 600); copy it to every "
              "machine keeping that mode (e.g. `scp -p`)", file=sys.stderr)
    else:
        print(auth.generate_secret())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from actorpy.demo import run_demo

    if args.workers < 1:
        raise ConfigError("--workers must be at least 1")
    return run_demo(workers=args.workers)


def _add_local_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """Flags an embedded local cluster (actorpy.runtime.local) starts its children with."""
    p.add_argument("--lifeline-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cluster-dir", help=argparse.SUPPRESS)
    p.add_argument("--cluster-dir-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--forked", action="store_true", help=argparse.SUPPRESS)


LOG_LEVELS = alog.LEVELS

#: subcommands of the core itself: starting one never scans the apps' entry points (the
#: manager and every worker of a local cluster start this way; a scan costs ~30 ms)
CORE_COMMANDS = frozenset({"manager", "worker", "status", "demo", "secret"})


def build_parser(with_apps: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="actorpy", description=__doc__.splitlines()[0])
    # A typo (DEBG) is refused before anything starts, as argparse refuses any bad flag:
    # a warning would scroll past, and a local cluster's children would log at the typo.
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS,
                        help="DEBUG, INFO, WARNING (default), ERROR or CRITICAL")
    if not with_apps:   # (a core command's start skips reading the apps' entry points)
        # its error's usage line still names every command: it listed the core ones only
        parser.error = lambda message: build_parser().error(message)  # type: ignore
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("manager", help="run a cluster manager")
    p.add_argument("--bind", required=True, help="tcp://0.0.0.0:PORT or ipc://PATH")
    p.add_argument("--secret-file", type=apputil.given("a file name"),
                   help="file holding the cluster secret (tcp)")
    _add_local_cluster_arguments(p)
    p.set_defaults(func=cmd_manager)

    p = sub.add_parser("worker", help="run a worker that joins a manager")
    p.add_argument("--manager", required=True, help="tcp://HOST:PORT or ipc://PATH")
    p.add_argument("--secret-file", type=apputil.given("a file name"),
                   help="file holding the cluster secret (tcp)")
    p.add_argument("--host", help="the host name or IPv4 address other nodes dial to reach "
                   "this worker (tcp; default: the bound one); with no --bind it binds there")
    p.add_argument("--bind", metavar="tcp://HOST:PORT",
                   help="where it listens (default: the address that routes to the manager, "
                        "any free port); behind NAT or in a container, e.g. "
                        "tcp://0.0.0.0:7401 with --host the address others reach it at")
    p.add_argument("--threads", type=int, help="tasks run at once (default 1)")
    _add_local_cluster_arguments(p)
    p.add_argument("--node-id", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("status", help="list a cluster's nodes")
    p.add_argument("--manager", required=True, help="tcp://HOST:PORT or ipc://PATH")
    p.add_argument("--secret-file", type=apputil.given("a file name"),
                   help="file holding the cluster secret (tcp)")
    # --timeout as in the apps; --timeout-s, its first name, still works
    p.add_argument("--timeout", "--timeout-s", dest="timeout_s", type=float, default=5.0,
                   metavar="S", help="how long the manager may take to answer (default 5)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("demo", help="run the demo on an embedded local cluster")
    p.add_argument("--workers", type=int, default=2,
                   help="worker processes of the embedded cluster (default 2)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("secret", help="make a fresh random cluster secret",
                       description="Print a fresh random cluster secret, or write it to a new "
                       "file of mode 600 with --out (a secret file other users can read is "
                       "refused).")
    p.add_argument("--out", metavar="F", help="write it to the new file F (mode 600)")
    p.set_defaults(func=cmd_secret)

    sub.add_parser("sim", help="barrier simulator (actorpy sim --help)", add_help=False)
    for name in sorted(_apps() if with_apps else ()):
        sub.add_parser(name, help=f"app (actorpy {name} --help)", add_help=False)
    return parser


def _command_index(argv: list[str]) -> int | None:
    """Where the subcommand word stands (after global options such as ``--log-level X``)."""
    i = 0
    while i < len(argv):
        if argv[i] == "--log-level":
            i += 2
        elif argv[i].startswith("-"):
            i += 1
        else:
            return i
    return None


def _hoist_log_level(argv: list[str], word: int | None) -> list[str]:
    """``argv`` with a ``--log-level X`` (or ``--log-level=X``) given after the subcommand
    moved before it, where the parser reads it: ``actorpy sgd ... --log-level DEBUG`` is
    what an error line's hint ("--log-level DEBUG shows the remote traceback") leads to."""
    if word is None:
        return argv
    head, rest, moved = argv[:word], [], []
    tail = argv[word + 1:]
    i = 0
    while i < len(tail):
        if tail[i] == "--":   # what follows is the subcommand's, as it is
            rest += tail[i:]
            break
        if tail[i] == "--log-level" and i + 1 < len(tail):
            moved += tail[i:i + 2]
            i += 2
        elif tail[i].startswith("--log-level="):
            moved.append(tail[i])
            i += 1
        else:
            rest.append(tail[i])
            i += 1
    return [*head, *moved, argv[word], *rest]


def _apps() -> dict[str, Any]:
    """Subcommands contributed by apps: ``{name: entry point}``."""
    from importlib.metadata import entry_points

    return {e.name: e for e in entry_points(group="actorpy.apps")}


def _open_standard_streams() -> None:
    """Give a closed stdin, stdout or stderr (``actorpy sgd <&-``, a daemon's) /dev/null
    (``launch.fill_standard_fds``), and ``sys.stdout`` a stream there rather than None."""
    names = {0: ("stdin", "r"), 1: ("stdout", "w"), 2: ("stderr", "w")}
    for fd in launch.fill_standard_fds():
        name, mode = names[fd]
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))


def main(argv: Sequence[str] | None = None) -> int:
    _open_standard_streams()
    try:
        return _main(argv)
    except BrokenPipeError:  # `actorpy sim --json | head`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:   # while an app's modules load, before it runs
        return 130


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = _hoist_log_level(argv, _command_index(argv))
    word = _command_index(argv)
    command = argv[word] if word is not None else None
    if command is not None and command not in CORE_COMMANDS:
        # `sim` and the apps own their argument parsers; forward everything after the word.
        apps = _apps()
        if command == "sim" or command in apps:
            pre = build_parser(with_apps=False).parse_args([*argv[:word], "secret"])
            if (status := _configure_logging(command, pre.log_level)) is not None:
                return status
            if command == "sim":
                from actorpy.barrier.cli import main as sub_main
            else:
                sub_main = apps[command].load()
            return _run(command, lambda: sub_main(argv[word + 1:]))
    args = build_parser(with_apps=command not in CORE_COMMANDS).parse_args(argv)
    if (status := _configure_logging(args.command, args.log_level)) is not None:
        return status
    return _run(args.command, lambda: args.func(args))


def _configure_logging(command: str | None, level: str | None) -> int | None:
    """Configure logging; a bad ``ACTORPY_LOG_LEVEL`` is one line on stderr and status 2."""
    try:
        alog.configure(level)
    except ConfigError as exc:
        print(f"actorpy{f' {command}' if command else ''}: {exc}", file=sys.stderr)
        return 2
    return None


def _run(command: str, fn: Any) -> int:
    """Run a subcommand; what it raises on purpose becomes one line on stderr and a status."""
    try:
        return fn()
    except ConfigError as exc:
        print(f"actorpy {command}: {apputil.error_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of stdout left: main() exits quietly
        raise
    except (ActorpyError, OSError) as exc:
        text = apputil.error_line(exc) if isinstance(exc, ActorpyError) else str(exc)
        print(f"actorpy {command}: {text}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except MemoryError as exc:   # --features 10**9: numpy says how much it could not get
        print(f"actorpy {command}: out of memory: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

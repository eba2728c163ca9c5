"""The open-files limit (``ulimit -n``): checked, and raised where the hard limit allows,
before a cluster starts.

Every ZeroMQ socket holds a descriptor or two, every link to a peer more, and a process out
of them fails wherever it happens to open the next one: under ``ulimit -n 24`` an embedded
cluster's driver reported "nothing is listening at ...manager" or waited 30 s for a manager
that could not start, a worker "exited before joining", and the demo "cannot send to w-...".
So a too-low soft limit is raised to the hard one's, or the start is refused at once with a
message that says what to raise.
"""
from __future__ import annotations

import logging
import os
import resource

import zmq

from actorpy.errors import ConfigError

log = logging.getLogger(__name__)

#: descriptors a process of ours needs whatever the cluster's size (sockets, pipes, the
#: interpreter's own files), and per worker of an embedded cluster (the manager's two
#: sockets per worker, their connections and monitors)
FILES_BASE = 32
FILES_PER_WORKER = 8
#: the fewest sockets a node's ZeroMQ context may hold (libzmq's default, ZMQ_MAX_SOCKETS).
#: A manager spends 3 per member (the link, its monitor and libzmq's end of the monitor):
#: held at this default, it refused its 339th member.
MIN_SOCKETS = 1023
#: descriptors still free below the open-files limit that mean it was not that limit which
#: refused a socket (a socket takes one or two)
_FILES_SLACK = 8


def files_needed(workers: int = 0) -> int:
    """About how many descriptors a cluster's busiest process needs, with ``workers``
    workers started here (0: joining a cluster that runs elsewhere)."""
    return FILES_BASE + FILES_PER_WORKER * workers


def ensure_open_files(need: int, what: str) -> None:
    """Make sure this process (and the processes it starts, which inherit the limit) may
    open ``need`` descriptors: raise the soft limit towards the hard one if it is lower.

    Raises:
        ConfigError: the hard limit is below ``need``; the message names ``what`` needs them.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ConfigError(f"the open-files limit is {soft} (`ulimit -n`, hard limit {hard}); "
                          f"{what} needs about {need}: raise it (`ulimit -n {max(need, 1024)}`"
                          " in the shell that starts it)")
    new = max(need, 1024) if hard == resource.RLIM_INFINITY else min(hard, max(need, 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    log.info("raised the open-files limit from %d to %d for %s", soft, new, what)


def size_context(ctx: zmq.Context) -> int:
    """Let ``ctx`` hold as many sockets as this process may open descriptors (each socket
    holds at least one), at least libzmq's default and at most its ceiling; before the
    context's first socket. Returns the new limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = ctx.get(zmq.SOCKET_LIMIT)
    limit = ceiling if soft == resource.RLIM_INFINITY else max(MIN_SOCKETS, min(soft, ceiling))
    ctx.set(zmq.MAX_SOCKETS, limit)
    return limit


def _open_files() -> int | None:
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return None


def no_socket_hint(ctx: zmq.Context) -> str:
    """Which limit a ZeroMQ EMFILE ("Too many open files") from ``ctx`` ran into, and what
    to do: the context's sockets (ZMQ_MAX_SOCKETS) or this process's descriptors."""
    sockets = ctx.get(zmq.MAX_SOCKETS)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = _open_files()
    files = "" if used is None else f"{used} open, "
    if soft != resource.RLIM_INFINITY and (used is None or used + _FILES_SLACK >= soft):
        return (f"this process has no file descriptor left ({files}open-files limit {soft}): "
                "raise the open-files limit, `ulimit -n`")
    return (f"this node's ZeroMQ context holds its maximum of {sockets} sockets "
            f"(ZMQ_MAX_SOCKETS; {files}open-files limit {soft}; a manager uses 3 per member); "
            "it follows the open-files limit when the node starts: raise that, `ulimit -n`, "
            "and restart the node")

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
import resource

from actorpy.errors import ConfigError

log = logging.getLogger(__name__)

#: descriptors a process of ours needs whatever the cluster's size (sockets, pipes, the
#: interpreter's own files), and per worker of an embedded cluster (the manager's two
#: sockets per worker, their connections and monitors)
FILES_BASE = 32
FILES_PER_WORKER = 8


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

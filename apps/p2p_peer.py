"""``actorpy peer``: a standalone P2P peer, with no manager anywhere. It joins the overlay
through any live peer and serves the jobs submitted to it (``Job.run_overlay``, or
``actorpy p2p-sgd --bootstrap``).

    actorpy secret --out cluster.secret                      # once; copy it to every host
    actorpy peer --bind tcp://10.0.0.4:7400 --secret-file cluster.secret
    actorpy peer --bind tcp://10.0.0.5:7400 --bootstrap tcp://10.0.0.4:7400 \\
        --secret-file cluster.secret

The first line on stdout says where the peer listens (``--bind tcp://HOST:0`` picks a free
port). SIGTERM or Ctrl-C hands the keys it stores to the next closest peers, then exits (status
0); a peer whose I/O loop gave up exits with status 1, for its supervisor to restart it.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any, Sequence

from actorpy import apputil
from actorpy.errors import ActorpyError, ConfigError, ProtocolError
from actorpy.runtime.address import refuse_ipv6, security_for
from engines.peer.dialer import check_endpoint
from engines.peer.shell import DRIVER_LEASE_S
from engines.peer.standalone import StandalonePeer, zmq_bind


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="actorpy peer",
        description="A standalone P2P peer, with no manager anywhere: it joins the overlay "
                    "through any live peer and serves the jobs submitted to it "
                    "(actorpy p2p-sgd --bootstrap, or Job.run_overlay). The first line on "
                    "stdout says where it listens; SIGTERM or Ctrl-C hands its keys on and "
                    "exits.")
    parser.add_argument("--bind", required=True, metavar="tcp://HOST:PORT",
                        help="where to listen (PORT 0: any free port)")
    parser.add_argument("--bootstrap", metavar="tcp://HOST:PORT",
                        help="any live peer of the overlay (none: this is the first peer)")
    parser.add_argument("--secret-file", metavar="F", type=apputil.given("a file name"),
                        help="the cluster secret (else ACTORPY_SECRET)")
    parser.add_argument("--host", help="the host other peers dial, if not the bound one")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds the bootstrap peer may take to answer (default 10)")
    parser.add_argument("--driver-lease", type=float, default=DRIVER_LEASE_S, metavar="S",
                        help="end a job once its driver has been unreachable this many "
                             f"seconds (killed, stopped, cut off; default {DRIVER_LEASE_S:g})")
    return parser


class _StopWhileJoining(BaseException):
    """SIGTERM or Ctrl-C while the peer still joins: it stops as a joined peer does (status
    0). A BaseException, as KeyboardInterrupt, so no ``except Exception`` swallows it."""


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    zmq_bind(args.bind)   # a bad --bind is refused before the secret is read
    if args.bootstrap is not None:
        try:
            check_endpoint(args.bootstrap)
        except ProtocolError:
            raise ConfigError(f"--bootstrap must be tcp://HOST:PORT of a live peer, not "
                              f"{args.bootstrap!r}") from None
        refuse_ipv6(args.bootstrap)
        if args.bootstrap == args.bind:   # it would answer its own hello, not a join
            raise ConfigError("--bootstrap is this peer's own --bind: name another live peer, "
                              "or leave it out for the first peer")
    if not 0 < args.timeout < float("inf"):   # inf: a silent --bootstrap held it for ever
        raise ConfigError("--timeout must be a positive number of seconds")
    if not 0 < args.driver_lease < float("inf"):
        raise ConfigError("--driver-lease must be a positive number of seconds")
    security = security_for(args.bind, secret_file=args.secret_file)
    peer = StandalonePeer(args.bind, security, host=args.host, bootstrap=args.bootstrap,
                          lease_s=args.driver_lease)
    stopped = threading.Event()
    failure: list[str] = []   # why its I/O loop gave up: exit 1, so a supervisor restarts it
    peer.node.on_fatal(lambda reason: (failure.append(reason), stopped.set()))
    # its peer service dead (a bug: a job's callbacks fail the job, never the service), the
    # process would stay up serving no job: it exits 1 instead, for its supervisor
    peer.host.on_service_died(lambda died: (failure.append(died.reason), stopped.set()))
    joining = [True]

    def on_signal(signum: int, frame: Any) -> None:
        signal.signal(signum, signal.SIG_DFL)  # a second signal ends the process outright
        stopped.set()
        if joining[0]:   # the join waits up to --timeout: stop waiting for it
            joining[0] = False
            raise _StopWhileJoining
    for sig in (signal.SIGINT, signal.SIGTERM):   # SIGTERM last: caught means both are
        signal.signal(sig, on_signal)
    try:
        try:
            try:
                contacts = peer.join(args.bootstrap, args.timeout) if args.bootstrap else 0
            finally:
                joining[0] = False
        except _StopWhileJoining:   # before: SIGTERM killed it (-15), Ctrl-C gave 130
            return 0   # it holds no keys yet: nothing to hand on
        joined = f"joined through {args.bootstrap}, {contacts} contacts" if args.bootstrap \
            else "the first peer"
        print(f"actorpy peer {peer.node_id} ready at {peer.endpoint} ({joined})", flush=True)
        while not stopped.wait(0.5):
            pass
        if not peer.node.closed and not failure:
            try:
                peer.leave()
            except ActorpyError as exc:
                print(f"actorpy peer: leaving: {exc}", file=sys.stderr)
    finally:
        peer.close()
    if failure:
        print(f"actorpy peer: {failure[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from apps import run_as_command

    raise SystemExit(run_as_command("peer"))

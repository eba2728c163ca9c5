"""P2P engine: a step with many keys (simulated, busy inboxes).

Run: ``python bench/peer_keys.py [--keys 50,100,200,400] [--rpc 0.5,0.1] [--service-ms 0.3]``

4 peers, replication 3, ASP, 5 steps; every peer pushes ones to every key each step, so
every key must end at 20. Each peer's inbox serves one message every ``--service-ms``
(``simrun.BusyInbox``: one thread on a loaded host), so a step's burst of per-key requests
queues as on the real wire. Prints, per row: virtual seconds, whether the values are exact,
messages per key and step, and the timeouts and keys stored again (re-replications) over
all peers; a row that did not end in 20 virtual seconds says so. ``--max-in-flight 0``
turns the per-contact cap of ``kademlia/window.py`` off.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actorpy.errors import ActorpyTimeout  # noqa: E402
from tests.peer.test_many_keys import run_keys  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", default="50,100,200,400")
    ap.add_argument("--rpc", default="0.5,0.1", help="rpc_timeout_s values")
    ap.add_argument("--service-ms", type=float, default=0.3)
    ap.add_argument("--max-in-flight", type=int, default=None)
    args = ap.parse_args()
    extra = {} if args.max_in_flight is None else {"max_in_flight": args.max_in_flight}
    print(f"{'keys':>5} {'rpc_s':>6} {'virt_s':>7} {'exact':>5} {'msg/key-step':>12} "
          f"{'timeouts':>8} {'re-repl':>8} {'cpu_s':>6}")
    for rpc in (float(r) for r in args.rpc.split(",")):
        for keys in (int(k) for k in args.keys.split(",")):
            cpu = time.process_time()
            try:
                result, run = run_keys(keys, args.service_ms / 1000, rpc_timeout_s=rpc, **extra)
            except ActorpyTimeout:
                print(f"{keys:>5} {rpc:>6} {'>20':>7} {'-':>5} {'-':>12} {'-':>8} {'-':>8} "
                      f"{time.process_time() - cpu:>6.1f}  (not done)")
                continue
            nodes = [p.node for p in run.peers.values()]
            exact = {float(v[0]) for v in result.model.values()} == {20.0}
            print(f"{keys:>5} {rpc:>6} {result.seconds:>7.2f} {str(exact):>5} "
                  f"{result.messages / keys / 5:>12.1f} "
                  f"{sum(n.stats.timeouts for n in nodes):>8} "
                  f"{sum(n.stats.replicated for n in nodes):>8} "
                  f"{time.process_time() - cpu:>6.1f}")


if __name__ == "__main__":
    main()

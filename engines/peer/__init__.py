"""Peer-to-peer engine: training on a Kademlia overlay with no server and no central table.

Files:
    kademlia/   the overlay's pure protocol core: ids, routing, messages and codec (values
                out of band), lookups, versioned storage, steps, uniform sampling, re-
                replication and leave, the sans-I/O node, and a simulator (see kademlia/)
    view.py     OverlayView: the barrier StepView over peers drawn through the overlay
    barrier.py  OverlayBarrier: draw peers, learn their steps (piggy-backed, PING if they
                would block), let the shared policy decide
    context.py  PeerContext, OwnerStore (what callbacks see) and JobSpec
    runner.py   PeerRunner: one peer's loop (schedule, fetch, push to owners, barrier)
    owner.py    KeyOwner: serves GET / PUSH for the keys a peer is closest to (pull, versioned
                writes, coalesced replication, adopting keys it should hold)
    peer.py     Peer: node + runner as the one object a shell drives
    job.py      Job: the PS engine's vocabulary (register_schedule/push/pull/barrier/stop)
    simrun.py   SimRun: a job on N in-process peers (SimNetwork, virtual time, kills, joins)
    shell.py    PeerService: a core service driving one Peer over the real wire (PeerKind)
    cluster_run.py  ClusterRun (Job.run): N peer services on a cluster's workers, start_peers
    dialer.py   Dialer: a manager-less node's endpoint book (validated hints), hello by address
    standalone.py   StandalonePeer: a peer process with no manager (``actorpy peer``)
    overlay_run.py  OverlayClient, OverlayRun (Job.run_overlay): a job on standalone peers

>>> from actorpy.barrier import PSP
>>> Job("demo", barrier=PSP(sample=2, staleness=1)).config.replication
3
"""
from __future__ import annotations

from .context import OwnerStore, PeerContext, balance_bound
from .job import MAX_OVERLAP, Job
from .peer import Peer
from .simrun import SimResult, SimRun

__all__ = ["MAX_OVERLAP", "Job", "OwnerStore", "Peer", "PeerContext", "SimResult", "SimRun",
           "balance_bound"]

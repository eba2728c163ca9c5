"""A step with many keys on peers whose inbox is served one message at a time.

On a loaded host a peer handles its messages one after another, a fraction of a
millisecond each; a step of K keys sends each peer hundreds of requests at once, and the
last ones wait for all the others. Before ``kademlia/window.py`` they waited past their
timeouts: a live peer was given up on, every key it held with us was stored again (a lookup
and STOREs per key), at every give-up, which lengthened the queues further: on 4 real peers
(rpc_timeout_s=0.5) 200 keys took 5 s and 400 did not end in 90 s. The simulator models the
inbox (``simrun.BusyInbox``): the same 400 keys did not end in 20 virtual seconds.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from actorpy.barrier import ASP
from engines import peer
from engines.peer.simrun import BusyInbox, SimResult, SimRun


def run_keys(keys: int, service_s: float = 0.0003, steps: int = 5, max_s: float = 20.0,
             **overlay: Any) -> tuple[SimResult, SimRun]:
    """Every one of 4 peers pushes ones to each of ``keys`` keys, ``steps`` times (ASP,
    replication 3); each peer's inbox serves a message every ``service_s``."""
    names = [f"k{i}" for i in range(keys)]
    job = peer.Job("count", barrier=ASP(), replication=3, seed=1, **overlay)
    job.register_schedule(lambda ctx: names)
    job.register_push(lambda ctx, v: {k: np.ones_like(x) for k, x in v.items()})

    def pull(store: Any, updates: dict[str, Any]) -> None:
        for k, x in updates.items():
            w, _ = store.get(k)
            store.set(k, w + x)
    job.register_pull(pull)
    job.register_stop(lambda ctx: ctx.step >= steps)
    run = SimRun(job, 4, {k: np.zeros(2) for k in names}, max_s=max_s,
                 link=lambda net, address, p: BusyInbox(net, address, p, service_s))
    return run.run(), run


def test_400_keys_through_busy_inboxes_end_exact_and_store_no_key_again() -> None:
    # (before: ActorpyTimeout, every peer at step 0 or 1 after 20 virtual seconds)
    result, run = run_keys(400, rpc_timeout_s=0.5)
    assert result.seconds < 10.0                # 4.2 virtual seconds
    _assert_exact_and_no_peer_given_up(result, run, 400)


def _assert_exact_and_no_peer_given_up(result, run, keys: int) -> None:
    assert {float(v[0]) for v in result.model.values()} == {20.0}
    assert result.updates == keys * 20
    nodes = [p.node for p in run.peers.values()]
    # no live peer was taken for dead, so no key was stored again (before: each give-up of
    # a peer that was only busy stored every key it held with us again)
    assert all(len(n.routing) == 3 for n in nodes)
    assert sum(n.stats.replicated for n in nodes) == 0


def test_100_keys_at_rpc_0_1_end_exact_and_evict_no_live_peer() -> None:
    # rpc_timeout_s=0.1: a PUSH's answer waits for its round, whose STOREs queue behind the
    # owner's other rounds in the holders' inboxes. Before: a CALL or STORE retried once to
    # a contact that had answered us meanwhile was a miss, two evicted the live owner, and
    # each eviction stored its keys again (ActorpyTimeout, 20 virtual seconds); an owner
    # also started a round per push at once (~3.7 a key and step). Now (``rounds.py``) at
    # most MAX_ROUNDS rounds are in flight per owner, later pushes of a key going together
    # with its round, and a timed-out CALL or STORE to a contact that answered us since it
    # was sent is no miss.
    result, run = run_keys(100, rpc_timeout_s=0.1)
    assert result.seconds < 5.0                 # 1.1 virtual seconds
    _assert_exact_and_no_peer_given_up(result, run, 100)
    assert result.messages < 30 * 100 * 5       # 26 a key and step (before: none ended)

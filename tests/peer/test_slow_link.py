"""A P2P job whose one key is large, over simulated links 5 x slower than the value
allowance's default assumes (``kademlia/sizes.py``: 0.02 s per MB, 50 MB/s): every push is
folded exactly once. Before the allowance followed the link, its requests timed out again and
again (their values resent), and the job made no step in minutes (simulated) or, on a real
100 Mbit/s link, ended with a model missing acknowledged pushes."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from actorpy.barrier import ASP
from engines import peer
from engines.peer.kademlia.sizes import MB
from engines.peer.simrun import SimRun
from tests.peer.paced import PacedLink

LINK_BYTES_PER_S = 10 * MB


def _job(name: str) -> peer.Job:
    """3 peers x 2 steps, 6 pushes of ones at lr 0.5: w ends at -3, clock 6."""
    job = peer.Job(name, barrier=ASP(), seed=1)
    job.register_schedule(lambda ctx: ["w"])
    job.register_push(lambda ctx, values: {"w": np.ones_like(values["w"])})
    job.register_pull(lambda store, up: store.set("w", store.get("w")[0] - 0.5 * up["w"]))
    job.register_stop(lambda ctx: ctx.step >= 2)
    return job


def _run_job(name: str, mb: int, **link: bool) -> tuple[SimRun, Any]:
    """The job on 3 peers (one key of ``mb`` MB) over ``PacedLink(..., **link)`` links,
    attached once the model is seeded; (the run, its result)."""
    run = SimRun(_job(name), 3, {"w": np.zeros(mb * MB // 4, np.float32)},
                 latency_s=(0.001, 0.002), max_s=300.0)
    for address in run.peers:
        run.net.attach(address, PacedLink(run.net, address, run.peers[address],
                                          LINK_BYTES_PER_S, **link))
    return run, run.run()


@pytest.mark.parametrize("mb", [4, 16])
def test_a_job_on_a_slow_link_folds_every_push_exactly_once(mb: int) -> None:
    run, result = _run_job("slowlink", mb, serial=True)
    # 3 peers x 2 steps: 6 pushes, each acknowledged, each folded once
    assert {a: p.runner.pushed for a, p in run.peers.items()} == dict.fromkeys(run.peers, 2)
    assert result.updates == 6 and result.clocks == {"w": 6}
    np.testing.assert_array_equal(result.model["w"], np.full(mb * MB // 4, -3.0, np.float32))
    assert result.steps == dict.fromkeys(run.peers, 2)


def test_a_job_whose_pings_wait_behind_values_keeps_every_acknowledged_push() -> None:
    """The same job over links where every message waits behind the values ahead of it
    (one TCP connection each way), the peers having measured their links fast while the
    model was seeded: PINGs and FIND_NODEs waited behind 16 MB values past their 0.1 s,
    live peers were evicted, two peers each took the key over, and the model ended at clock
    4 (w = -2) with all 6 pushes acknowledged, as on a real 100 Mb/s link. Now a small
    request to a peer that values move with also waits for the largest of them to move
    (``LinkPace.behind_s``), a write no other peer took is not durable while this peer
    knows others, and a peer is done only once its own writes are on another holder."""
    mb = 16
    run, result = _run_job("fifolink", mb, queue_all=True)
    assert {a: p.runner.pushed for a, p in run.peers.items()} == dict.fromkeys(run.peers, 2)
    assert result.clocks == {"w": 6}
    np.testing.assert_array_equal(result.model["w"], np.full(mb * MB // 4, -3.0, np.float32))


@pytest.mark.parametrize("mb, slow, seed", [(16, "n0", 0), (16, "n0", 1), (16, "n0", 2),
                                            (16, "n2", 0), (16, "n2", 1), (16, "n2", 2),
                                            (4, "n0", 11), (4, "n0", 12)])
def test_one_peer_behind_a_slow_link_loses_no_acknowledged_push(mb: int, slow: str,
                                                                seed: int) -> None:
    """One peer behind a 10 MB/s link both ways (as a worker across a 100 Mb/s link), the
    other two beside each other (no pacing between them); one TCP connection per pair of
    peers: a small message waits behind the values ahead of it to the same peer. With the
    peer behind the link the seeding one's neighbour (n2), the code before ended at clock 4
    (w = -2) under each of these network seeds: the far peer, its PINGs to the others and
    theirs to it answered late behind 16 MB, evicted them, took the key over and folded its
    own pushes on a branch that was lost. n0 behind it (the seeding peer) lost a peer's
    pushes once with the waits fixed but before a peer's end waited for its own writes;
    with 4 MB under seeds 11 and 12, n1 took the key over (n0 evicted), folded n2's two
    pushes on n2 too, and n0's round at the same clock then replaced both copies: a holder
    now refuses a write of another branch than its copy's (``Store.base``)."""
    rate = LINK_BYTES_PER_S

    def link(net: Any, address: str, inner: Any) -> PacedLink:
        only = None if address == slow else frozenset({slow})
        return PacedLink(net, address, inner, rate, queue_pair=True, only_to=only)
    run = SimRun(_job("onefar"), 3, {"w": np.zeros(mb * MB // 4, np.float32)},
                 latency_s=(0.001, 0.002), max_s=300.0, seed=seed, link=link)
    result = run.run()
    assert {a: p.runner.pushed for a, p in run.peers.items()} == dict.fromkeys(run.peers, 2)
    assert result.clocks == {"w": 6}
    np.testing.assert_array_equal(result.model["w"], np.full(mb * MB // 4, -3.0, np.float32))


@pytest.mark.parametrize("mb, seed", [(4, 7), (16, 1)])
def test_a_peer_refused_by_the_holders_does_not_take_the_key_over_again_and_again(
        mb: int, seed: int) -> None:
    """n0 behind the slow link, network seed 7: n1 evicted n0 (its answers late behind 4 MB)
    and took the key over; n2, which still knew n0, refused each round, and n1 took the key
    over again at once, folding its own two updates each time: 27 take-overs in 0.4 s, 60
    folds for the job's 6 (the model right all the same: the stamps dedupe; 128 with 16 MB
    under seed 1). The same on a
    real 100 Mb/s link in 6 runs of 50 (84-554 folds). Now a refused peer waits while a peer
    closer to the key that it evicted lately may be alive, and PINGs it (``_holding``)."""
    def link(net: Any, address: str, inner: Any) -> PacedLink:
        only = None if address == "n0" else frozenset({"n0"})
        return PacedLink(net, address, inner, LINK_BYTES_PER_S, queue_pair=True, only_to=only)
    run = SimRun(_job("loop"), 3, {"w": np.zeros(mb * MB // 4, np.float32)},
                 latency_s=(0.001, 0.002), max_s=300.0, seed=seed, link=link)
    result = run.run()
    assert result.clocks == {"w": 6}
    assert result.updates <= 12, result.updates

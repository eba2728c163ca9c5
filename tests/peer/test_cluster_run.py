"""The driver's side of a cluster run (``ClusterRun``): reading keys through its peers and
stopping them at the end, the peers it took for lost included."""
from __future__ import annotations

import pytest

import actorpy
from actorpy.barrier import ASP, PSP
from tests.peer.linreg import NAMES, init, linreg, shard

CALL_S = 30


@pytest.fixture(scope="module")
def cluster():
    with actorpy.connect(workers=2) as c:
        yield c


def test_a_read_by_a_name_no_key_has_is_refused_and_loses_no_peer(cluster):
    # before: run.read(0) in on_poll marked every peer that refused it lost, the job
    # failed ("every peer of the job is gone") and the peers trained on, stopped by nobody
    seen = []

    def on_poll(run, seconds):
        if not seen:
            with pytest.raises(actorpy.ConfigError, match="keys are named by str"):
                run.read(0)
            seen.append((run.read(NAMES[0])[1] >= 0, sorted(run.lost)))

    result = linreg(PSP(sample=1, staleness=2), steps=20).run(
        cluster, peers=3, init=init(), data=shard, timeout_s=60, on_poll=on_poll)
    assert seen == [(True, [])]
    assert result.lost == [] and sorted(result.steps.values()) == [20] * 3


def test_a_peer_taken_for_lost_while_it_runs_is_stopped_at_the_end(cluster):
    # a peer given up on (a status that timed out) but still running: before, the stop
    # at the end went to the live peers only, and it ran on, named, on its worker
    job = linreg(ASP(), steps=30)
    names = []

    def on_poll(run, seconds):
        if 0 not in run.lost:
            names.append(f"peer/{run.spec.name}/{id(run):x}/0")   # start_peers' name
            assert cluster.lookup_async(names[0]).result(CALL_S) == run.refs[0]
            run.lose(0, TimeoutError("taken for lost by the test"))

    job.run(cluster, peers=3, init=init(), data=shard, timeout_s=60, on_poll=on_poll)
    assert cluster.lookup_async(names[0]).result(CALL_S) is None

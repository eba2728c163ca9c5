"""Sizes the training apps refuse before a cluster starts: minibatches and networks beyond
this machine's memory, negative barrier numbers, more peers than workers can hold."""
from __future__ import annotations

import socket

import pytest

import actorpy
from actorpy.config import Config
from actorpy.errors import ConfigError
from actorpy.runtime.manager import Manager
from actorpy.wire.auth import Security
from apps import p2p_sgd, sgd


@pytest.mark.parametrize("app", ["sgd", "p2p-sgd", "dnn"])
def test_an_absurd_batch_is_refused_before_a_cluster_starts(app):
    # before: each ran its cluster until --timeout (every worker stuck allocating a
    # 1e9-row minibatch), then blamed the stop condition
    if app == "dnn":
        pytest.importorskip("torch")
        pytest.importorskip("sklearn")
        from apps import dnn
        main = dnn.main
    else:
        main = {"sgd": sgd.main, "p2p-sgd": p2p_sgd.main}[app]
    with pytest.raises(ConfigError, match=r"--batch 1000000000 .*need about .* GiB of memory, "
                                          r"more than the .* GiB available"):
        main(["--batch", str(10**9), "--workers", "1", "--steps", "1", "--timeout", "3"])


# before: --manager skipped the check (its workers run elsewhere) and the run went on until
# --timeout, every worker stuck allocating; p2p-sgd --manager skipped it after sgd made it
# (3 peers on 1 worker: 3 minibatches at once)
@pytest.mark.parametrize("main, flags, count", [
    (sgd.main, [], 1), (p2p_sgd.main, ["--peers", "3"], 3)], ids=["sgd", "p2p-sgd"])
def test_an_absurd_batch_is_refused_by_the_workers_machines_with_manager(main, flags, count):
    with actorpy.connect(workers=1) as cluster:
        address = cluster.local.manager_address
        with pytest.raises(ConfigError, match=rf"--batch 1000000000 \({count} minibatches at "
                                              rf"once\) need about .* GiB of memory, more "
                                              rf"than the .* GiB available on "
                                              rf"{socket.gethostname()}"):
            main(["--manager", address, *flags, "--batch", str(10**9), "--steps", "1",
                  "--timeout", "3"])


def test_p2p_sgd_on_a_cluster_with_no_workers_says_so_as_sgd_does(tmp_path):
    # before: "the cluster has no workers: add some (cluster.add_workers)", exit 1
    manager = Manager(f"ipc://{tmp_path}/manager", Security.ipc(), Config()).start()
    try:
        for main in (sgd.main, p2p_sgd.main):
            with pytest.raises(ConfigError, match="the cluster has no live workers to train on"):
                main(["--manager", manager.address, "--steps", "1", "--timeout", "5"])
    finally:
        manager.stop(tell_nodes=False)


def test_a_network_beyond_memory_is_refused_before_a_cluster_starts():
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    from apps import dnn

    with pytest.raises(ConfigError, match=r"--hidden 100000000 \(1 workers\) need about"):
        dnn.main(["--hidden", str(10**8), "--workers", "1", "--steps", "1", "--timeout", "3"])


@pytest.mark.parametrize("app, flag", [(sgd, "--staleness"), (sgd, "--sample"), (sgd, "--high"),
                                       (p2p_sgd, "--staleness"), (p2p_sgd, "--sample")])
def test_negative_barrier_numbers_are_argparse_errors(app, flag, capsys):
    with pytest.raises(SystemExit) as info:
        app.build_parser().parse_args([flag, "-1"])
    assert info.value.code == 2
    assert f"argument {flag}: must be >= 0, got -1" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--peers", "100000"], "--peers 100000 is more than the 128 that 2 workers hold"),
    (["--peers", "65", "--workers", "1"], "--peers 65 is more than the 64 that 1 workers"),
    (["--peers", "100000", "--manager", "tcp://127.0.0.1:9"], "--peers 100000 is more than 4096"),
    (["--replication", "0"], "--replication must be >= 1"),
])
def test_p2p_sizes_a_cluster_cannot_hold_are_refused(argv, words):
    with pytest.raises(ConfigError, match=words):
        p2p_sgd.parse(argv)
    assert p2p_sgd.parse(["--peers", "128"]).peers == 128

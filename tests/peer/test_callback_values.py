"""What a P2P job's callbacks are handed and may hand back, on simulated peers: the values'
kinds (a 0-d key's numpy scalars), their protection (read-only), and the keys ``pull`` may
set."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from actorpy.barrier import ASP
from actorpy.errors import ConfigError, RemoteError
from engines.peer import Job, OwnerStore, PeerContext
from engines.peer.kademlia.rpc import MAX_ARG_CHARS


def counting(name: str, steps: int = 3) -> Job:
    """Each peer pushes ones into ``name`` every step; ``pull`` adds them."""
    job = Job("counting", barrier=ASP())
    job.register_schedule(lambda ctx: [name])
    job.register_push(lambda ctx, values: {name: np.ones_like(values[name])})
    job.register_pull(lambda store, u: store.set(name, store.get(name)[0] + u[name]))
    job.register_stop(lambda ctx: ctx.step >= steps)
    return job


class TestZeroDimensionalKey:
    def test_a_numpy_scalar_of_the_keys_dtype_is_taken_as_its_0d_array(self) -> None:
        # before: numpy's 0-d arithmetic gives a scalar, refused both ways ("pull set key
        # 'lr' to a float64, where the model holds a float64 array of shape ()"), where the
        # PS engine takes it (engines/param/store.py check_update)
        job = counting("lr")
        result = job.simulate(peers=3, init={"lr": np.array(0.0)})
        assert result.model["lr"].shape == () and float(result.model["lr"]) == 9.0

        @job.register_push
        def push(ctx: PeerContext, values: dict[str, np.ndarray]) -> dict[str, object]:
            assert type(values["lr"]) is np.ndarray     # pull and push get 0-d arrays
            return {"lr": values["lr"] * 0 + 1}          # an np.float64

        @job.register_pull
        def pull(store: OwnerStore, updates: dict[str, np.ndarray]) -> None:
            assert type(updates["lr"]) is np.ndarray and updates["lr"].shape == ()
            store.set("lr", store.get("lr")[0] + updates["lr"])

        result = job.simulate(peers=3, init={"lr": np.array(0.0)})
        assert type(result.model["lr"]) is np.ndarray and result.model["lr"].shape == ()
        assert float(result.model["lr"]) == 9.0

    def test_a_scalar_of_another_dtype_is_still_refused(self) -> None:
        job = counting("lr")
        job.register_pull(lambda store, u: store.set("lr", np.float32(1.0)))
        with pytest.raises(RemoteError, match="pull set key 'lr' to a float32"):
            job.simulate(peers=2, init={"lr": np.array(0.0)})


class TestKeys:
    def test_a_key_longer_than_a_wire_arg_is_refused_up_front(self) -> None:
        # before: taken; a non-owner's GET and PUSH carry the key as an rpc arg, which the
        # owner dropped (evicting the sender) every time: the run hung until its timeout
        job = counting("k" * (MAX_ARG_CHARS + 1))
        for start in (lambda **kw: job.simulate(peers=2, **kw),
                      lambda **kw: job.run(None, peers=2, timeout_s=5, **kw)):
            with pytest.raises(ConfigError, match=rf"^init key 'k+'\.\.\. has "
                                                  rf"{MAX_ARG_CHARS + 1} characters, over "
                                                  rf"the limit of {MAX_ARG_CHARS}"):
                start(init={"k" * (MAX_ARG_CHARS + 1): np.zeros(2)})
        key = "é" * MAX_ARG_CHARS           # the limit counts characters, not UTF-8 bytes
        result = counting(key).simulate(peers=3, init={key: np.zeros(2)}, wire=True, max_s=60)
        assert result.model[key].tolist() == [9.0, 9.0]


class RecordingCluster:
    """A cluster stand-in that records each ``start_service``'s options; every call answers
    a peer's INFO (id, address)."""

    def __init__(self) -> None:
        self.started: list[dict[str, object]] = []

    def workers(self) -> list[str]:
        return ["w1"]

    def start_service(self, factory: object, *args: object, **options: object) -> str:
        self.started.append(options)
        return f"ref{len(self.started)}"

    def call(self, ref: str, kind: object, *args: object, **options: object) -> object:
        return 1, f"addr-{ref}"


class TestStartBound:
    def test_starting_a_peer_waits_no_longer_than_the_runs_time_left(self) -> None:
        # before: start_service waited its own default 60 s on a worker that did not start
        # the service (wedged by an earlier job's pull): a run of timeout_s=5 ended at 60 s
        from engines.peer.cluster_run import ClusterRun, start_peers
        cluster = RecordingCluster()
        start_peers(cluster, 2, Job("x").config, deadline=time.monotonic() + 5.0)
        run = ClusterRun(counting("w"), cluster, 1, {"w": np.zeros(2)}, timeout_s=5.0)
        run.deadline, run.refs = time.monotonic() + 5.0, ["ref0"]
        run.add_peer()
        assert len(cluster.started) == 3
        for options in cluster.started:
            assert 0 < float(options.get("timeout_s", math.inf)) <= 5.0  # type: ignore[arg-type]


def side_counter(replication: int) -> Job:
    """Keys a-d each get ones from every peer; folding one also sets key 'n'."""
    job = Job("side", barrier=ASP(), replication=replication)
    job.register_schedule(lambda ctx: list("abcd"))
    job.register_push(lambda ctx, values: {k: np.ones_like(v) for k, v in values.items()})

    @job.register_pull
    def pull(store: OwnerStore, updates: dict[str, np.ndarray]) -> None:
        for key, update in updates.items():
            store.set(key, store.get(key)[0] + update)
            store.set("n", np.ones(1))     # (its clock counts the sets)
    job.register_stop(lambda ctx: ctx.step >= 3)
    return job


class TestPullSets:
    @pytest.mark.parametrize("peers, replication", [(1, 3), (3, 3), (4, 2)])
    def test_pull_may_set_only_the_key_it_folds(self, peers: int, replication: int) -> None:
        # before: a set of key 'n' while folding another went wherever pull ran: with one
        # peer it counted, where 'n' was a replica it became a branch lost to the owner's
        # (on a cluster: n = 11 of 60 sets, no error), where 'n' was held nowhere here
        # "holds no key 'n'": the outcome hung on the placement. Now one error, always
        init = {k: np.zeros(1) for k in "abcdn"}
        with pytest.raises(RemoteError, match=r"KeyError: .*pull set key 'n' while folding "
                                              r"'[abcd]': pull runs on '[abcd]''s owner"):
            side_counter(replication).simulate(peers=peers, init=init, max_s=60)


def scribbling(where: str, kind: str) -> tuple[Job, dict[str, object], list[str]]:
    """A counting job whose ``push`` (or ``pull``) first writes 1000 into the value it was
    handed (``pull``: the one ``store.get`` returned, with no ``set`` after it); returns the
    job, its init and the list each refusal's message lands in."""
    torch = pytest.importorskip("torch") if kind == "torch" else None
    refused: list[str] = []

    def scribble(value: object) -> None:
        try:
            value[0] = 1000.0               # type: ignore[index]
        except ValueError as exc:           # numpy's "assignment destination is read-only"
            refused.append(str(exc))

    job = counting("w")

    @job.register_push
    def push(ctx: PeerContext, values: dict[str, object]) -> object:
        if where == "push":
            scribble(values["w"])
        return {"w": values["w"] * 0 + 1}      # type: ignore[operator]

    @job.register_pull
    def pull(store: OwnerStore, updates: dict[str, object]) -> None:
        w, _ = store.get("w")
        if where == "pull":
            scribble(w)
        else:
            store.set("w", w + updates["w"])
    init = {"w": torch.zeros(3) if torch is not None else np.zeros(3)}
    return job, init, refused


class TestReadOnly:
    @pytest.mark.parametrize("kind", ["numpy", "torch"])
    def test_push_cannot_change_the_stored_copy_in_place(self, kind: str) -> None:
        # before: the key's owner handed push a view of its own stored copy (writeable:
        # Blob.to_value of a buffer made in its process), so v[0] = 1000 changed the model
        # (final [1009, 9, 9] with 3 peers); numpy's values are read-only now, a tensor is
        # the peer's own (torch has no read-only flag; the PS engine's workers get theirs)
        job, init, refused = scribbling("push", kind)
        result = job.simulate(peers=3, init=init)
        assert [float(x) for x in result.model["w"]] == [9.0] * 3
        assert len(refused) == (9 if kind == "numpy" else 0)
        assert all("read-only" in message for message in refused)

    @pytest.mark.parametrize("kind", ["numpy", "torch"])
    def test_pull_cannot_change_the_stored_copy_in_place(self, kind: str) -> None:
        # before: store.get returned a writeable view of the owner's copy: w[0] = 1000
        # without a set changed the owner's copy at its clock, not its holders' (PS: numpy
        # values are stored read-only, docs/param.md)
        job, init, refused = scribbling("pull", kind)
        result = job.simulate(peers=3, init=init)
        assert [float(x) for x in result.model["w"]] == [0.0] * 3
        assert len(refused) == (9 if kind == "numpy" else 0)

    def test_a_numpy_value_pull_set_is_stored_read_only(self) -> None:
        # before: stored without a copy and left writeable: a write after the set changed
        # the stored copy (the PS engine's Store.set makes it read-only)
        job, refused = counting("w"), []

        @job.register_pull
        def pull(store: OwnerStore, updates: dict[str, np.ndarray]) -> None:
            new = store.get("w")[0] + updates["w"]
            store.set("w", new)
            try:
                new[0] = 1000.0
            except ValueError as exc:
                refused.append(str(exc))
        result = job.simulate(peers=3, init={"w": np.zeros(3)})
        assert result.model["w"].tolist() == [9.0] * 3 and len(refused) == 9

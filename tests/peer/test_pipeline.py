"""A pipelined peer's bookkeeping (``pipeline.py``) and read-your-writes (``context.read_own``):
deeper than one step, a step reads the values with its peer's own unanswered updates folded
in by ``pull`` on a private view, so it misses only the other peers' updates meanwhile."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from actorpy.barrier import ASP, SSP, Policy
from engines.peer import OwnerStore
from engines.peer.context import read_own
from engines.peer.pipeline import Pipeline

from .linreg import KEYS, linreg, record_folds, run, weight_error


def minus(store: OwnerStore, updates: dict[str, np.ndarray]) -> None:
    for name, update in updates.items():
        store.set(name, store.get(name)[0] - update)


class TestPending:
    def test_the_batch_out_then_the_waiting_steps_in_step_order(self) -> None:
        pipe = Pipeline(3)
        pipe.queue(0, {"a": "a0", "b": "b0"}, stacks=True)
        pipe.take()
        pipe.queue(1, {"b": "b1"}, stacks=True)
        pipe.queue(2, {"a": "a2"}, stacks=True)
        assert pipe.pending() == [(0, "a", "a0"), (0, "b", "b0"), (1, "b", "b1"),
                                  (2, "a", "a2")]
        assert not pipe.landed("a")           # a's push was answered: its update is in
        assert pipe.pending() == [(0, "b", "b0"), (1, "b", "b1"), (2, "a", "a2")]
        assert pipe.landed("b")
        assert pipe.take() == {"b": ((1, "b1"),), "a": ((2, "a2"),)}
        assert pipe.pending() == [(1, "b", "b1"), (2, "a", "a2")]


class TestReadOwn:
    def test_folds_the_pending_updates_in_step_order_into_a_copy(self) -> None:
        w = np.array([10.0, 20.0])
        seen: list[tuple[str, int, bool, int]] = []

        def pull(store: OwnerStore, updates: dict[str, np.ndarray]) -> None:
            value, clock = store.get("w")
            seen.append((store.sender, store.sender_step, store.private, clock))
            store.set("w", value * 2 - updates["w"])      # order matters

        view = read_own(pull, {"w": (w, 7), "b": (np.zeros(1), 0)},
                        [(3, "w", np.array([1.0, 1.0])), (4, "w", np.array([0.0, 2.0]))],
                        "me")
        assert view["w"].tolist() == [38.0, 76.0]          # (2w - 1) * 2 - (0, 2)
        assert w.tolist() == [10.0, 20.0]                  # the answered value is untouched
        assert view["b"].tolist() == [0.0]
        assert seen == [("me", 3, True, 7), ("me", 4, True, 8)]

    def test_a_key_this_peer_does_not_read_is_skipped(self) -> None:
        view = read_own(minus, {"w": (np.ones(2), 0)}, [(0, "other", np.ones(2))], "me")
        assert view["w"].tolist() == [1.0, 1.0]

    def test_a_pull_that_writes_in_place_cannot_touch_the_values(self) -> None:
        w, update = np.ones(2), np.ones(2)

        def in_place(store: OwnerStore, updates: dict[str, np.ndarray]) -> None:
            value, _ = store.get("w")
            value -= updates["w"]
            store.set("w", value)

        with pytest.raises(ValueError, match="read-only"):
            read_own(in_place, {"w": (w, 0)}, [(0, "w", update)], "me")
        assert w.tolist() == [1.0, 1.0] and update.tolist() == [1.0, 1.0]

    def test_tensors_are_cloned(self) -> None:
        torch = pytest.importorskip("torch")
        w = torch.ones(2)

        def in_place(store: OwnerStore, updates: dict[str, object]) -> None:
            value, _ = store.get("w")
            value -= updates["w"]
            store.set("w", value)

        view = read_own(in_place, {"w": (w, 0)}, [(0, "w", torch.ones(2))], "me")
        assert view["w"].tolist() == [0.0, 0.0] and w.tolist() == [1.0, 1.0]


class TestDeeperPipeline:
    @pytest.mark.parametrize("barrier", [ASP(), SSP(3)], ids=["asp", "ssp3"])
    def test_steps_read_their_own_pending_updates(self, barrier: Policy) -> None:
        """overlap=2 at lr 0.05 (8 peers, 1 ms compute, 2-3 ms a way): 0.0009-0.0010 from
        w* where steps that miss their own pending updates end 0.0027-0.0028 away (overlap=1:
        0.0006); each update is still folded once, on its owner, in step order."""
        job = linreg(barrier, steps=30, lr=0.05)
        job.overlap = 2
        folded = record_folds(job)
        _, result = run(job, compute_s=lambda index, step: 0.001, latency_s=(0.002, 0.003))
        assert weight_error(result.model) < 0.0015, weight_error(result.model)
        assert result.updates == 8 * 30 * KEYS
        assert len(folded) == 8 * KEYS
        assert all(steps == list(range(30)) for steps in folded.values())

    def test_a_pull_that_cannot_run_privately_leaves_the_values_as_answered(
            self, caplog: pytest.LogCaptureFixture) -> None:
        """A pull that writes in place fails on the private view: the peer logs it once and
        reads the values as answered from then on; the run is the one without read-own."""
        lr = 0.02

        def in_place(store: OwnerStore, updates: dict[str, np.ndarray]) -> None:
            for name, grad in updates.items():
                w, _clock = store.get(name)
                w = np.array(w) if not store.private else w   # the owner's copy is its own
                w -= lr * grad
                store.set(name, w)

        job = linreg(ASP(), steps=40, lr=lr)
        job.overlap = 3
        job.register_pull(in_place)
        with caplog.at_level(logging.INFO, logger="engines.peer.runner"):
            _, result = run(job, peers=4, compute_s=lambda index, step: 0.001,
                            latency_s=(0.002, 0.003))
        fallbacks = [r for r in caplog.records if "cannot fold" in r.getMessage()]
        assert 1 <= len(fallbacks) <= 4 and "read-only" in fallbacks[0].getMessage()
        assert result.updates == 4 * 40 * KEYS and set(result.steps.values()) == {40}
        assert weight_error(result.model) < 0.05

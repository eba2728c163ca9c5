"""The server core on its own (sans I/O, FakeClock): barrier properties on the real engine,
deferred releases, joins, departures, validation, aggregation, stop, LB-BSP, stragglers."""
from __future__ import annotations

import numpy as np
import pytest

from actorpy.barrier import ASP, BSP, DSSP, PSP, SSP
from actorpy.errors import ConfigError
from actorpy.ids import NodeId
from engines.param.errors import CallbackError, UpdateError
from engines.param.job import FunctionBarrier
from engines.param.kinds import Join, Push, Status
from engines.param.server import CheckpointDue
from tests.param.harness import Sim, go, make_core

A, B, C = NodeId("a"), NodeId("b"), NodeId("c")


def _start(core, *workers):
    out = []
    for i, w in enumerate(workers):
        out = core.join(Join(w, 0, i))
    return out


class TestBarrierOnTheRealCore:
    @pytest.mark.parametrize("staleness", [0, 1, 3])
    def test_ssp_nobody_more_than_s_ahead(self, staleness):
        sim = Sim(SSP(staleness=staleness), 5, seed=staleness,
                  means=[1.0, 1.0, 1.0, 1.0, 4.0]).run(200.0)
        assert sim.max_lead <= staleness
        assert sim.max_spread <= staleness + 1
        assert min(sim.pushes.values()) > 20   # it ran, the straggler included

    def test_bsp_spread_at_most_one(self):
        sim = Sim(BSP(), 4, seed=1, means=[1.0, 2.0, 1.0, 3.0]).run(100.0)
        assert sim.max_lead == 0 and sim.max_spread <= 1
        assert max(sim.pushes.values()) - min(sim.pushes.values()) <= 1

    def test_asp_runs_away_from_a_straggler(self):
        sim = Sim(ASP(), 3, seed=2, means=[1.0, 1.0, 5.0]).run(200.0)
        assert sim.max_spread > 50
        assert sim.pushes[NodeId("w0")] > 3 * sim.pushes[NodeId("w2")]

    def test_dssp_lead_within_high(self):
        sim = Sim(DSSP(low=1, high=4), 4, seed=3, means=[1.0, 1.0, 1.0, 3.0]).run(300.0)
        assert sim.max_lead <= 4 and sim.max_spread <= 5
        assert sim.max_lead > 1   # the controller did grant extra staleness

    def test_psp_full_sample_is_ssp_and_zero_sample_is_asp(self):
        full = Sim(PSP(sample=4, staleness=2), 5, seed=4, means=[1, 1, 1, 1, 4]).run(150.0)
        assert full.max_lead <= 2
        none = Sim(PSP(sample=0, staleness=0), 5, seed=4, means=[1, 1, 1, 1, 4]).run(150.0)
        assert none.max_spread > 20

    def test_psp_small_sample_lies_between(self):
        means = [1.0] * 7 + [5.0]
        bsp = Sim(BSP(), 8, seed=5, means=means).run(200.0)
        psp = Sim(PSP(sample=2, staleness=0), 8, seed=5, means=means).run(200.0)
        asp = Sim(ASP(), 8, seed=5, means=means).run(200.0)
        fast = NodeId("w0")
        assert bsp.pushes[fast] < psp.pushes[fast] < asp.pushes[fast]


class TestReleases:
    def test_start_barrier_then_bsp_round_with_weighted_mean(self):
        core = make_core(BSP(), [A, B])
        assert core.join(Join(A, 0, 0)) == []          # held: b has not joined
        assert go(core.join(Join(B, 0, 1))) == {A: 0, B: 0}
        assert core.push(A, Push(1, {"w": np.array([1.0, 1.0])}, 1, 0.1)) == []   # held
        out = core.push(B, Push(1, {"w": np.array([5.0, 5.0])}, 3, 0.1))
        assert go(out) == {A: 1, B: 1}
        # one pull with (1*1 + 3*5) / 4 = 4, lr 0.1
        assert np.allclose(out[0].reply.values["w"], [-0.4, -0.4])
        assert core.progress.pulls == 1 and core.progress.updates == 2
        assert core.store.get("w")[1] == 1              # the key's clock

    def test_lost_worker_releases_the_held_and_its_keys_are_reissued(self):
        def schedule(store, workers):
            return {w: [{"a": "x", "b": "y", "c": "z"}[w]] for w in workers}
        init = {k: np.zeros(1) for k in "xyz"}
        core = make_core(BSP(), [A, B, C], init=init, schedule=schedule)
        _start(core, A, B, C)
        core.push(A, Push(1, {"x": np.ones(1)}, 1, 0.1))
        assert core.push(B, Push(1, {"y": np.ones(1)}, 1, 0.1)) == []
        out = core.leave(C)                              # c dies mid-step, holding "z"
        assert go(out) == {A: 1, B: 1}
        keys = sorted(k for a in out for k in a.reply.values)
        assert keys == ["x", "y", "z"]                   # "z" went to someone else

    @pytest.mark.parametrize("plan, words", [
        (lambda workers: {i: ["w"] for i in range(len(workers))}, "keyed its plan by [0, 1]"),
        (lambda workers: {w: "w" for w in workers}, "gave a worker a str")])
    def test_a_schedule_not_keyed_by_worker_ids_is_an_error(self, plan, words):
        # before: a plan keyed by worker indexes was ignored (every worker got no key and
        # the job returned init untrained), and a str of keys was split into characters
        core = make_core(BSP(), [A, B], schedule=lambda store, workers: plan(workers))
        with pytest.raises(CallbackError, match=words.replace("[", r"\[").replace("]", r"\]")):
            _start(core, A, B)

    def test_joiner_starts_at_the_slowest_step(self):
        core = make_core(BSP(), [A])
        _start(core, A)
        for step in range(1, 4):
            core.push(A, Push(step, {}, 1, 0.1))
        out = core.join(Join(B, 0, 1))
        assert go(out) == {B: 3}
        assert core.push(A, Push(4, {}, 1, 0.1)) == []  # now a waits for b
        assert go(core.push(B, Push(4, {}, 1, 0.1))) == {A: 4, B: 4}

    def test_expected_worker_lost_before_joining_opens_the_start(self):
        core = make_core(SSP(staleness=1), [A, B])
        assert core.join(Join(A, 0, 0)) == []
        assert go(core.leave(B)) == {A: 0}


class TestUpdates:
    @pytest.mark.parametrize("update, words", [
        ({"v": np.ones(2)}, ["unknown key 'v'", "['w']"]),
        ({"w": np.ones(3)}, ["'w'", "(3,)", "(2,)"]),
        ({"w": np.ones(2, dtype=np.float32)}, ["float32", "float64"]),
        ({"w": [1.0, 2.0]}, ["a list", "float64 array"]),
    ])
    def test_bad_update_is_refused_and_changes_nothing(self, update, words):
        core = make_core(BSP(), [A, B])
        _start(core, A, B)
        with pytest.raises(UpdateError) as info:
            core.push(A, Push(1, update, 1, 0.1))
        for word in words:
            assert word in str(info.value)
        assert core.progress.steps == {A: 0, B: 0}
        core.push(A, Push(1, {"w": np.ones(2)}, 1, 0.1))
        out = core.push(B, Push(1, {"w": np.ones(2)}, 1, 0.1))
        assert np.allclose(out[0].reply.values["w"], [-0.1, -0.1])   # only good updates

    def test_bad_torch_update(self):
        torch = pytest.importorskip("torch")
        core = make_core(ASP(), [A], init={"w": torch.zeros(3)})
        _start(core, A)
        with pytest.raises(UpdateError, match=r"float64 tensor of shape \(3,\).*float32 tensor"):
            core.push(A, Push(1, {"w": torch.zeros(3, dtype=torch.float64)}, 1, 0.1))
        out = core.push(A, Push(1, {"w": torch.ones(3)}, 1, 0.1))
        assert torch.allclose(out[0].reply.values["w"], torch.full((3,), -0.1))

    @pytest.mark.parametrize("policy", [BSP(), ASP()], ids=["bsp", "asp"])
    def test_a_zero_d_key_takes_numpy_scalars(self, policy):
        # before: numpy's arithmetic on a 0-d array gives a numpy scalar (np.float64), which
        # the shard refused as "a float64, but the model's 'b' is a float64 array of shape ()"
        core = make_core(policy, [A, B], init={"b": np.array(0.0)})
        _start(core, A, B)
        core.push(A, Push(1, {"b": np.float64(1.0)}, 1, 0.1))
        core.push(B, Push(1, {"b": np.float64(3.0)}, 1, 0.1))
        value, clock = core.store.get("b")
        assert type(value) is np.ndarray and value.shape == () and value.dtype == np.float64
        assert value == pytest.approx(-0.2 if policy == BSP() else -0.4)
        assert clock == (1 if policy == BSP() else 2) and not value.flags.writeable
        with pytest.raises(UpdateError, match="is a float32, but the model's 'b' is a float64 "
                                              r"array of shape \(\)"):   # the dtype still counts
            core.push(A, Push(2, {"b": np.float32(1.0)}, 1, 0.1))

    def test_a_torch_update_or_set_that_requires_grad_is_refused(self):
        # before: taken, as docs/param.md said it was not, and the model's w then required
        # grad (every later w - lr * u a node of one growing autograd graph)
        torch = pytest.importorskip("torch")
        core = make_core(ASP(), [A], init={"w": torch.zeros(3)})
        _start(core, A)
        with pytest.raises(UpdateError, match=r"the update from worker a for key 'w' is a "
                                              r"float32 tensor of shape \(3,\) that requires "
                                              r"grad; .*\.detach\(\)"):
            core.push(A, Push(1, {"w": torch.ones(3, requires_grad=True)}, 1, 0.1))
        with pytest.raises(UpdateError, match="pull set a value for key 'w' is a float32 "
                                              "tensor of shape .* that requires grad"):
            core.store.set("w", torch.ones(3, requires_grad=True))
        value, clock = core.store.get("w")
        assert clock == 0 and not value.requires_grad and not value.any()
        out = core.push(A, Push(1, {"w": torch.ones(3)}, 1, 0.1))
        assert torch.allclose(out[0].reply.values["w"], torch.full((3,), -0.1))

    def test_pull_that_raises_leaves_the_model_whole(self):
        def pull(store, updates):
            store.set("w", store.get("w")[0] + 1)
            raise ZeroDivisionError("boom")
        core = make_core(ASP(), [A], pull=pull)
        _start(core, A)
        with pytest.raises(CallbackError, match="pull raised ZeroDivisionError: boom") as info:
            core.push(A, Push(1, {"w": np.ones(2)}, 1, 0.1))
        assert isinstance(info.value.__cause__, ZeroDivisionError)
        assert np.array_equal(core.model()["w"], np.zeros(2)) and core.store.get("w")[1] == 0

    def test_a_barrier_that_raises_is_reported_as_a_callback_error(self):
        # before: the bare ZeroDivisionError, saying neither callback nor worker
        def barrier(me_step, view):
            if me_step >= 1:
                raise ZeroDivisionError("boom")
            return True
        core = make_core(FunctionBarrier(barrier), [A, B])
        _start(core, A, B)                 # the start barrier decides at step 0
        with pytest.raises(CallbackError, match="barrier raised ZeroDivisionError: boom on "
                                                "server shard 0, deciding for worker a") as info:
            core.push(A, Push(1, {"w": np.ones(2)}, 1, 0.1))
        assert isinstance(info.value.__cause__, ZeroDivisionError)

    def test_stored_arrays_are_read_only(self):
        core = make_core(ASP(), [A])
        with pytest.raises(ValueError, match="read-only"):
            core.model()["w"][0] = 1.0

    @pytest.mark.parametrize("aggregate, pulls, expected", [
        ("sum", 1, -0.6), ("each", 2, -0.6), ("mean", 1, -0.3)])
    def test_aggregate_modes(self, aggregate, pulls, expected):
        core = make_core(BSP(), [A, B], aggregate=aggregate)
        _start(core, A, B)
        core.push(A, Push(1, {"w": np.full(2, 2.0)}, 1, 0.1))
        out = core.push(B, Push(1, {"w": np.full(2, 4.0)}, 1, 0.1))
        assert core.progress.pulls == pulls
        assert np.allclose(out[0].reply.values["w"], expected)

    @pytest.mark.parametrize("policy", [SSP(staleness=1), PSP(sample=1, staleness=1),
                                        DSSP(low=1, high=1)], ids=["ssp", "pssp", "dssp"])
    def test_asynchronous_policies_never_average_a_held_workers_update(self, policy):
        """A held at the bound: its update waits in the buffer until B's push releases it;
        both are then folded as steps of their own (as had each arrived alone), not as
        their mean (which would halve both)."""
        core = make_core(policy, [A, B])
        _start(core, A, B)
        core.push(A, Push(1, {"w": np.full(2, 1.0)}, 1, 0.1))
        out = core.push(A, Push(2, {"w": np.full(2, 1.0)}, 1, 0.1))
        assert out == [] and core.progress.updates == 1     # A is 2 ahead: held, buffered
        out = core.push(B, Push(1, {"w": np.full(2, 3.0)}, 1, 0.1))
        assert {a.worker for a in out} == {A, B}
        assert core.progress.pulls == 3 and core.progress.updates == 3
        assert np.allclose(out[0].reply.values["w"], -0.1 * (1.0 + 1.0 + 3.0))


class TestStalledBarrier:
    """A barrier that holds every worker while none computes (no push on its way to re-run
    it): before, the job waited out its timeout_s, which blamed stop, push, pull or data=."""

    def test_holding_every_worker_fails_at_once_when_nobody_can_join(self):
        off_by_one = FunctionBarrier(lambda me, view: all(me < s for s in view.steps().values()))
        core = make_core(off_by_one, [A, B], closed=True)
        with pytest.raises(CallbackError, match=r"the barrier holds every worker \(a at step 0, "
                                                r"b at step 0\) and none is computing: nothing "
                                                r"can release them; register_barrier's"):
            _start(core, A, B)

    def test_elastic_it_is_said_and_a_joiner_may_still_release_them(self):
        # a barrier waiting for a third worker is legitimate where workers may join
        core = make_core(FunctionBarrier(lambda me, view: len(view.steps()) >= 2), [A, B])
        assert _start(core, A, B) == [] and "holds every worker" in core.stalled
        assert core.stats()["stalled"] == core.stalled
        assert go(core.join(Join(C, 0, 2))) == {A: 0, B: 0, C: 0}
        assert core.stalled is None

    @pytest.mark.parametrize("policy, lookahead", [
        (BSP(), 0), (SSP(2), 0), (SSP(1), 1), (ASP(), 1), (PSP(2, 0), 0), (PSP(1, 1), 1),
        (DSSP(0, 3), 0), (DSSP(1, 4), 1)])
    def test_a_built_in_policy_never_trips_it(self, policy, lookahead):
        sim = Sim(policy, 4, seed=6, means=[1.0, 1.0, 2.0, 6.0], closed=True,
                  lookahead=lookahead).run(100.0)   # (closed: a stall would raise)
        assert min(sim.pushes.values()) > 5 and sim.core.stalled is None


class TestStopAndCheckpoints:
    def test_stop_finishes_held_and_later_workers(self):
        core = make_core(BSP(), [A, B], stop=lambda store: store.step >= 2)
        _start(core, A, B)
        for step in (1, 2):
            core.push(A, Push(step, {"w": np.ones(2)}, 1, 0.1))
            out = core.push(B, Push(step, {"w": np.ones(2)}, 1, 0.1))
        assert {a.worker: a.reply.status for a in out} == {A: Status.FINISH, B: Status.FINISH}
        assert core.push(A, Push(3, {"w": np.ones(2)}, 1, 0.1))[0].reply.status == Status.FINISH
        assert core.progress.pulls == 2

    @pytest.mark.parametrize("policy", [BSP(), ASP()], ids=["bsp", "asp"])
    def test_steps_with_no_updates_still_meet_the_stop(self, policy):
        """Pushes that return nothing run no pull, after which stop was checked: such a
        job never stopped (a hang until its timeout)."""
        core = make_core(policy, [A, B], stop=lambda store: store.step >= 2)
        _start(core, A, B)
        for step in (1, 2):
            for w in (A, B):
                out = core.push(w, Push(step, {}, 1, 0.1))
        assert core.halted == Status.FINISH and core.progress.pulls == 0
        assert {a.worker: a.reply.status for a in out}[B] == Status.FINISH
        assert core.push(A, Push(3, {}, 1, 0.1))[0].reply.status == Status.FINISH

    def test_halt_at_a_step_completes_the_round_first(self):
        """Another shard stopped at step 2: a half-received round 2 is completed, not
        folded half, and the stop step travels with FINISH."""
        core = make_core(BSP(), [A, B])
        _start(core, A, B)
        core.push(A, Push(1, {"w": np.ones(2)}, 1, 0.1))
        core.push(B, Push(1, {"w": np.ones(2)}, 1, 0.1))
        core.push(A, Push(2, {"w": np.ones(2)}, 1, 0.1))
        assert core.halt(at_step=2) == [] and core.halting and core.progress.pulls == 1
        out = core.push(B, Push(2, {"w": 3 * np.ones(2)}, 1, 0.1))
        assert {a.worker: (a.reply.status, a.reply.stopped_at) for a in out} == {
            A: (Status.FINISH, 2), B: (Status.FINISH, 2)}
        assert core.progress.pulls == 2 and not core.halting
        assert np.allclose(core.model()["w"], -0.1 * (1 + 2) * np.ones(2))
        early = make_core(BSP(), [A, B])   # reached already, or no worker left: at once
        _start(early, A, B)
        early.halt(at_step=0)
        assert early.halted == Status.FINISH and not early.halting
        assert early.push(A, Push(1, {"w": np.ones(2)}, 1, 0.1))[0].reply.stopped_at == 0

    def test_stop_reading_another_shards_key_does_not_vote(self):
        from engines.param.server import Callbacks, ServerCore, ShardConfig
        from engines.param.store import Store
        from actorpy.clock import FakeClock
        from tests.param.harness import sgd_pull
        key_map = {"w": 0, "v": 1}
        store = Store({"w": np.zeros(2)}, key_map, 0)
        core = ServerCore(ShardConfig(policy=ASP(), shards=2), store,
                          Callbacks(sgd_pull(), stop=lambda s: s.get("v")[0].sum() > 1),
                          FakeClock())
        core.join(Join(A, 0, 0))
        assert go(core.push(A, Push(1, {"w": np.ones(2)}, 1, 0.1))) == {A: 1}

    def test_checkpoint_every_n_pulls_and_restore(self):
        core = make_core(ASP(), [A], checkpoint_every=2)
        _start(core, A)
        due = [a for s in range(1, 6) for a in core.push(A, Push(s, {"w": np.ones(2)}, 1, 0.1))
               if isinstance(a, CheckpointDue)]
        assert [d.snapshot.pulls for d in due] == [2, 4]
        again = make_core(ASP(), [B])
        again.restore(due[-1].snapshot)
        assert np.allclose(again.model()["w"], -0.4) and again.store.get("w")[1] == 4
        assert go(again.join(Join(B, 0, 0))) == {B: 4}   # resumes at the saved step


def _lbbsp_round(core, step, batches, compute, updates=None):
    """One BSP round: each worker pushes its update with the compute time ``compute[w](b)``
    of its batch (the slower last). Returns the next round's batches."""
    out = []
    for _, w in sorted((compute[w](batches[w]), w) for w in batches):
        update = updates[w] if updates else {"w": np.ones(2)}
        out = core.push(w, Push(step, update, batches[w], compute[w](batches[w])))
    return {a.worker: a.reply.batch for a in out}


def _async_run(policy, balance, pushes=120, slower=3):
    """Workers A and B (3x slower per sample) on the core, each pushing when its compute of
    its batch is done and going on when answered GO. Returns the final batches, steps, the
    time each waited at the barrier, and the time simulated."""
    core = make_core(policy, [A, B], balance=balance, batch=64)
    per_sample = {A: 0.001, B: 0.001 * slower}
    batch, steps, waited, held_at, due = {A: 64, B: 64}, {A: 0, B: 0}, {A: 0.0, B: 0.0}, {}, {}
    for w in go(_start(core, A, B)):
        due[w] = per_sample[w] * batch[w]
    now = 0.0
    for _ in range(pushes):
        now, w = min((t, v) for v, t in due.items())
        del due[w]
        steps[w] += 1
        held_at[w] = now
        for a in core.push(w, Push(steps[w], {"w": np.ones(2)}, batch[w],
                                   per_sample[w] * batch[w])):
            if a.reply.status == Status.GO:
                waited[a.worker] += now - held_at.pop(a.worker)
                batch[a.worker] = a.reply.batch or batch[a.worker]
                due[a.worker] = now + per_sample[a.worker] * batch[a.worker]
    return batch, steps, waited, now


class TestTuning:
    def test_lbbsp_gives_the_slow_worker_a_smaller_batch(self):
        core = make_core(BSP(), [A, B], balance=True, batch=64)
        _start(core, A, B)
        batches = {A: 64, B: 64}
        compute = {A: lambda b: 0.001 * b, B: lambda b: 0.003 * b}
        for step in range(1, 5):
            batches = _lbbsp_round(core, step, batches, compute)
        assert sum(batches.values()) == 128
        assert batches[A] == pytest.approx(96, abs=2) and batches[B] == pytest.approx(32, abs=2)

    def test_lbbsp_round_is_one_step_on_the_union_of_the_batches(self):
        """Once balanced (3:1), a round's updates weighted by the batches the workers used
        move the model exactly as one gradient over both batches together would, whatever
        the split."""
        rng = np.random.default_rng(5)
        x, y = rng.normal(size=(200, 3)), rng.normal(size=200)

        def grad(w, rows):
            return x[rows].T @ (x[rows] @ w - y[rows]) / len(rows)

        core = make_core(BSP(), [A, B], init={"w": rng.normal(size=3)}, balance=True,
                         batch=64)
        _start(core, A, B)
        batches = {A: 64, B: 64}
        compute = {A: lambda b: 0.001 * b, B: lambda b: 0.003 * b + 0.016}
        for step in range(1, 9):
            w, _ = core.store.get("w")
            rows = {A: np.arange(batches[A]), B: np.arange(batches[A], 128)}
            updates = {v: {"w": grad(w, rows[v])} for v in (A, B)}
            before = dict(batches)
            batches = _lbbsp_round(core, step, batches, compute, updates)
            assert np.allclose(core.store.get("w")[0], w - 0.1 * grad(w, np.arange(128)))
            assert sum(batches.values()) == 128 and sum(before.values()) == 128
        assert batches[A] == pytest.approx(100, abs=2)   # 96, and 4 for B's fixed 16 ms

    @pytest.mark.parametrize("policy", [SSP(staleness=2), PSP(sample=1, staleness=2),
                                        DSSP(low=1, high=3)])
    def test_balance_under_bounded_staleness_keeps_a_3x_slower_worker_in_pace(self, policy):
        """Workers released one at a time (no rounds): each GO carries the worker's batch,
        and once balanced both take as long per step, so the fast one stops waiting at the
        bound for the slow one."""
        batch, steps, waited, elapsed = _async_run(policy, balance=True)
        assert sum(batch.values()) == 128
        assert batch[A] == pytest.approx(96, abs=2) and batch[B] == pytest.approx(32, abs=2)
        assert abs(steps[A] - steps[B]) <= 3
        assert waited[A] < 0.05 * elapsed and waited[B] == 0
        _, plain_steps, plain_waited, plain_elapsed = _async_run(policy, balance=False)
        assert plain_waited[A] > 0.5 * plain_elapsed      # without: held 2/3 of the time
        assert plain_steps[A] - plain_steps[B] >= 1

    def test_balance_under_bounded_staleness_shrinks_a_batch_to_a_quarter_at_most(self):
        # each update is a step of its own there: before, a 20x slower worker went down to
        # 6 of 64 samples, and `actorpy sgd --barrier ssp --balance` diverged now and then
        batch, _, _, _ = _async_run(SSP(staleness=2), balance=True, slower=20)
        assert batch[B] == 16 and batch[A] == 112

    def test_balance_needs_a_barrier_that_holds_workers(self):
        from engines.param import Job
        job = Job("j", barrier=ASP())
        job.register_push(lambda ctx, values: {})
        job.register_pull(lambda store, updates: None)
        job.register_stop(lambda store: True)
        with pytest.raises(ConfigError, match="BSP, SSP, PSP or DSSP"):
            job.start(None, init={"w": np.zeros(2)}, balance=True)

    def test_a_straggler_factor_of_zero_is_refused_not_taken_as_off(self):
        with pytest.raises(ConfigError, match="factor > 1"):
            make_core(SSP(staleness=2), [A, B], straggler_factor=0)

    def test_persistent_straggler_is_released_and_not_taken_back(self):
        core = make_core(SSP(staleness=2), [A, B, C], straggler_factor=3.0,
                         straggler_patience=3)
        _start(core, A, B, C)
        released = []
        for step in range(1, 12):
            for w, t in ((A, 1.0), (B, 1.1), (C, 10.0)):
                if w in core.progress.steps:
                    for a in core.push(w, Push(step, {"w": np.ones(2)}, 10, t)):
                        if a.reply.status == Status.RELEASED:
                            released.append((a.worker, step))
        assert [w for w, _ in released] == [C] and released[0][1] >= 5
        assert core.join(Join(C, 0, 2))[0].reply.status == Status.RELEASED
        assert core.progress.steps == {A: 11, B: 11}

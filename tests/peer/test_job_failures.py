"""A P2P job's bad input on simulated peers: a callback that raises, a push, pull or schedule
that does not fit the model, a stop with no truth value, missing callbacks: each a clear
error, never a hang."""
from __future__ import annotations

import numpy as np
import pytest

from actorpy.barrier import ASP, BSP
from actorpy.errors import RemoteError
from engines.peer import Job, OwnerStore

from .linreg import KEYS, AnswerPolicy, FailingPolicy, init, linreg, run, shard


class TestFailures:
    def test_a_barrier_that_raises_surfaces_as_a_remote_error(self) -> None:
        # before: the bare exception came out of the simulator (and on a cluster the
        # peer's handler died with it: tests/peer/test_shell.py)
        job = linreg(FailingPolicy(), steps=5)
        with pytest.raises(RemoteError, match="ZeroDivisionError: no view") as info:
            run(job, peers=3, max_s=60)
        assert info.value.node_id.startswith("n") and "in decide" in info.value.remote_traceback

    def test_a_barrier_may_answer_a_bool_but_not_a_string(self) -> None:
        # before: a bool failed with "AttributeError: 'bool' object has no attribute
        # 'advance'" (the PS engine takes one), and the PS engine took "no" as True
        _, result = run(linreg(AnswerPolicy(True), steps=5), peers=3, max_s=60)
        assert set(result.steps.values()) == {5}
        job = linreg(AnswerPolicy("no"), steps=5)
        with pytest.raises(RemoteError, match=r"TypeError: barrier returned a str; it must "
                                              r"return a Decision, True \(advance\) or False"):
            run(job, peers=3, max_s=60)

    def test_a_failing_pull_surfaces_as_a_remote_error(self) -> None:
        job = linreg(ASP(), steps=5)

        @job.register_pull
        def pull(store: OwnerStore, updates: dict[str, np.ndarray]) -> None:
            raise ValueError("bad update")

        with pytest.raises(RemoteError, match="ValueError: bad update"):
            run(job, peers=3)

    @pytest.mark.parametrize("bad, error", [
        (lambda ctx, values: None, r"push on peer n\d+ returned None; return a dict of key "
                                   r"-> update, or \{\} for no update this step"),
        (lambda ctx, values: {"nokey": np.ones(4)}, "update for 'nokey', which is not one"),
        (lambda ctx, values: {"w0": np.ones(7)}, "shape \\(7,\\), where the model holds a "
                                                 "float64 array of shape \\(4,\\)"),
        (lambda ctx, values: {"w0": np.ones(4, np.float32)}, "a float32 array"),
        (lambda ctx, values: {"w0": 1.0}, "key 'w0' a float, where"),
    ], ids=["none", "unknown-key", "shape", "dtype", "scalar"])
    def test_a_push_that_does_not_fit_is_a_clear_error(self, bad: object,
                                                         error: str) -> None:
        # before: an unknown key was asked of its owner forever (a hang until the timeout),
        # a wrong shape failed in some owner's pull, a float stopped the peer's service
        job = linreg(ASP(), steps=5)
        job.register_push(bad)
        with pytest.raises(RemoteError, match=error):
            run(job, peers=3, max_s=60)

    @pytest.mark.parametrize("where", ["push", "pull", "stop"])
    def test_a_callback_that_calls_sys_exit_fails_the_job(self, where: str) -> None:
        # before: SystemExit went through every handler (they caught Exception), out of the
        # simulator; on a peer it ended the peer's service (tests/peer/test_standalone.py)
        job = linreg(ASP(), steps=5)

        def leave(*_: object) -> None:
            raise SystemExit(3)

        {"push": job.register_push, "pull": job.register_pull,
         "stop": job.register_stop}[where](leave)
        with pytest.raises(RemoteError, match="SystemExit: 3"):
            run(job, peers=3, max_s=60)

    def test_a_push_that_returns_an_empty_dict_is_a_step_without_update(self) -> None:
        job = linreg(ASP(), steps=5)
        job.register_push(lambda ctx, values: {})
        _, result = run(job, peers=3, max_s=60)
        assert set(result.steps.values()) == {5} and result.updates == 0
        assert all(np.array_equal(result.model[n], v) for n, v in init().items())

    def test_a_pipelined_peer_whose_last_steps_update_nothing_still_stops(self) -> None:
        """overlap=3, pushes slower than steps: steps 1 and 2 return {} and the peers stop
        at 3, while step 0's pushes travel; once they land the two steps send nothing, and
        nothing is left to wait for (a peer so waited for good, WORKING, until the timeout)."""
        job = linreg(ASP(), steps=3)
        job.overlap = 3
        push = job.spec({}).push
        job.register_push(lambda ctx, values: push(ctx, values) if ctx.step == 0 else {})
        _, result = run(job, peers=3, max_s=60, compute_s=lambda index, step: 0.001,
                        latency_s=(0.002, 0.003))
        assert set(result.steps.values()) == {3} and result.updates == 3 * KEYS

    @pytest.mark.parametrize("bad, error", [
        (lambda ctx: ["nokey"], "schedule named 'nokey', which is not a key of the model"),
        (lambda ctx: "w0", "schedule returned str; it must return a list of keys"),
    ], ids=["unknown-key", "str"])
    def test_a_schedule_naming_no_key_of_the_model_is_a_clear_error(self, bad: object,
                                                                     error: str) -> None:
        job = linreg(ASP(), steps=5)
        job.register_schedule(bad)
        with pytest.raises(RemoteError, match=error):
            run(job, peers=3, max_s=60)

    @pytest.mark.parametrize("value, error", [
        (np.zeros(9), r"pull set key 'w\d' to a float64 array of shape \(9,\)"),
        ([0.0] * 4, r"pull set key 'w\d' to a list"),
    ], ids=["shape", "list"])
    def test_a_pull_setting_a_misfit_value_is_a_clear_error(self, value: object,
                                                                      error: str) -> None:
        # before: the model silently took the new shape (or the peer's service failed)
        job = linreg(ASP(), steps=5)
        job.register_pull(lambda store, updates: store.set(next(iter(updates)), value))
        with pytest.raises(RemoteError, match=error):
            run(job, peers=3, max_s=60)

    def test_a_big_endian_model_takes_native_order_values(self) -> None:
        # before: pushes and pulls compute native "<f8" from a ">f8" model: refused as
        # another dtype ("a float64 array, where the model holds a >f8 array")
        job = linreg(ASP(), steps=5)
        result = job.simulate(peers=3, init={n: v.astype(">f8") for n, v in init().items()},
                              data=shard)
        assert {v.dtype.str for v in result.model.values()} == {">f8"}
        assert result.updates == 3 * 5 * KEYS

    def test_a_pull_setting_a_key_it_does_not_hold_fails(self) -> None:
        job = linreg(ASP(), steps=5)
        job.register_pull(lambda store, updates: store.set("zz", np.zeros(4)))
        with pytest.raises(RemoteError, match="pull set key 'zz' while folding 'w"):
            run(job, peers=3, max_s=60)

    def test_a_stop_whose_answer_is_not_a_truth_value_fails_the_job(self) -> None:
        job = linreg(ASP(), steps=5)
        job.register_stop(lambda ctx: np.array([True, False]))   # before: numpy's "truth
        with pytest.raises(RemoteError,                            # value of an array ..."
                           match=r"stop returned a bool array of shape \(2,\); it must"):
            run(job, peers=3, max_s=60)

    def test_no_peer_or_an_empty_model_is_a_config_error(self) -> None:
        # before: init={} ran until the timeout (every peer waited at step 0 for its key),
        # simulate(peers=0) failed with an IndexError, run(peers=0) with an ActorpyError
        from actorpy.errors import ConfigError
        job = linreg(ASP(), steps=1)
        for start in (job.simulate, lambda **kw: job.run(None, timeout_s=5, **kw)):
            with pytest.raises(ConfigError, match="init must name at least one key"):
                start(peers=2, init={})
            # before: numpy's "truth value of an array ... is ambiguous", or an
            # AttributeError for a list of pairs
            for bad, what in ((np.zeros(2), r"a float64 array of shape \(2,\)"),
                              ([("w", np.zeros(2))], "a list")):
                with pytest.raises(ConfigError, match=f"^init is {what}: it must be a dict"):
                    start(peers=2, init=bad)
            with pytest.raises(ConfigError, match="int number of peers >= 1, got 0"):
                start(peers=0, init=init())
            # before: a TypeError from a comparison or from range()
            for peers in (1.5, "2", True):
                with pytest.raises(ConfigError, match=f"got {peers!r}"):
                    start(peers=peers, init=init())
            # before: Blob's TypeError naming no key (a RemoteError on a cluster); a 0-d
            # array came back of shape (1,) (tests/peer/kademlia/test_values.py)
            for value in (np.array(["ab", "c"]), np.zeros(2, dtype=[("a", "f4")])):
                with pytest.raises(ConfigError, match=r"init\['w0'\] is a numpy array of "
                                                      "dtype .* \\(numeric dtypes only\\)"):
                    start(peers=2, init={**init(), "w0": value})
            with pytest.raises(ConfigError, match=r"init key '\\ud800' is not valid Unicode"):
                start(peers=2, init={"\ud800": np.zeros(4)})   # before: UnicodeEncodeError
            # before: TypeError "cannot store a numpy array of dtype object" from simulate,
            # a RemoteError from a peer on a cluster
            with pytest.raises(ConfigError, match=r"init\['w0'\] is an array of dtype object"):
                start(peers=2, init={**init(), "w0": np.array([1, "a"], dtype=object)})

    @pytest.mark.parametrize("answer, said", [
        (None, "None"),          # before: None is false, so every peer ran until the timeout
        ("no", "a str"),         # before: "no" is true: every peer stopped at once
        ([True, False], "a list")])
    def test_a_stop_that_returns_no_yes_or_no_fails_the_job(self, answer, said) -> None:
        job = linreg(ASP(), steps=5)
        job.register_stop(lambda ctx: answer)
        with pytest.raises(RemoteError, match=f"stop returned {said}; it must return True"):
            run(job, peers=3, max_s=60)

    def test_missing_callbacks_are_a_config_error(self) -> None:
        from actorpy.errors import ConfigError
        # before: "register them with job.register_<name>", the placeholder as it is
        with pytest.raises(ConfigError, match=r"schedule, push, pull, stop: register them "
                                              r"with job.register_schedule\(fn\), job.register_"
                                              r"push\(fn\), job.register_pull\(fn\), "
                                              r"job.register_stop\(fn\)$"):
            Job("empty").spec()
        # before: a job with no pull started, and failed at the first push an owner folded
        unpulled = Job("unpulled")
        unpulled.register_schedule(lambda ctx: ["w"])
        unpulled.register_push(lambda ctx, values: {"w": values["w"]})
        unpulled.register_stop(lambda ctx: True)
        with pytest.raises(ConfigError, match=r"has no pull: register it with "
                                              r"job.register_pull\(fn\)$"):
            unpulled.simulate(peers=2, init={"w": np.zeros(2)})
        # before: taken, then every peer failed with "'int' object is not callable"
        job = linreg(ASP(), steps=1)
        for role in ("schedule", "push", "pull", "stop"):
            with pytest.raises(ConfigError, match=f"^register_{role} must be a function, "
                                                  "got an int$"):
                getattr(job, f"register_{role}")(5)
        for start in (lambda **kw: job.simulate(peers=2, **kw),
                      lambda **kw: job.run(None, peers=2, timeout_s=5, **kw),
                      lambda **kw: job.run_overlay("tcp://127.0.0.1:1", timeout_s=5, **kw)):
            with pytest.raises(ConfigError, match="^data must be a function, got a tuple$"):
                start(init=init(), data=(1, 2))
        with pytest.raises(ConfigError, match="unknown overlay"):
            Job("x", rpc_timeout=1.0)
        with pytest.raises(ConfigError, match="replication"):
            Job("x", replication=0)
        # before: a negative seed failed as numpy's ValueError traceback on every peer,
        # rpc_timeout_s=0 made every request time out (44 s for 5 steps), alpha=0 and a
        # NaN or infinite timeout_s were taken
        with pytest.raises(ConfigError, match="seed must be an int >= 0, got -1"):
            Job("x", seed=-1)
        with pytest.raises(ConfigError, match="rpc_timeout_s must be a finite number > 0"):
            Job("x", rpc_timeout_s=0.0)
        with pytest.raises(ConfigError, match="rpc_timeout_s_per_mb must be a finite number"):
            Job("x", rpc_timeout_s_per_mb=-1.0)      # a ValueError from KademliaConfig
        with pytest.raises(ConfigError, match="alpha must be an int >= 1"):
            Job("x", alpha=0)
        with pytest.raises(ConfigError, match="durable must be True or False"):
            Job("x", durable="no")
        with pytest.raises(ConfigError, match="overlap must be True, False or an int"):
            Job("x", overlap=-1)
        # before: taken, and a str barrier failed on every peer as an AttributeError
        for name in ("", 5):
            with pytest.raises(ConfigError, match="a job needs a non-empty str name"):
                Job(name)
        # before: taken, then the run failed as its first peer registered its service name
        with pytest.raises(ConfigError, match=r"^a job name has at most 150 characters \(it "
                                              r"names the job's services\), not 1,000: 'xxx"):
            Job("x" * 1000)
        assert Job("x" * 150).name == "x" * 150
        with pytest.raises(ConfigError, match="barrier must be BSP"):
            Job("x", barrier="ssp")
        with pytest.raises(ConfigError, match="barrier must be BSP.*got <class"):
            Job("x", barrier=BSP)    # the class: before, taken, and failed on every peer
        with pytest.raises(ConfigError, match="replication must be an int"):
            Job("x", replication=True)
        with pytest.raises(ConfigError, match="alpha must be an int >= 1"):
            Job("x", alpha=True)
        # numpy integers are ints (before: "must be an int" for np.int64(2)), kept plain
        job = Job("x", replication=np.int64(2), alpha=np.int64(2), overlap=np.int64(2),
                  batch=np.int64(16))
        assert (job.config.replication, job.config.alpha, job.overlap, job.batch) == (2, 2, 2, 16)
        assert type(job.overlap) is int and type(job.config.alpha) is int
        assert Job("x", overlap=True).overlap is True
        with pytest.raises(ConfigError, match="timeout_s must be a finite number > 0"):
            linreg(ASP(), steps=1).run(None, peers=2, init=init(), timeout_s="5")
        for timeout in (float("nan"), float("inf")):
            with pytest.raises(ConfigError, match="timeout_s must be a finite number > 0"):
                linreg(ASP(), steps=1).run(None, peers=2, init=init(), timeout_s=timeout)

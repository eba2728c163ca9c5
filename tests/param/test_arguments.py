"""What a job refuses before it runs: callbacks that are no functions, names too long for the
services they name, missing callbacks, bad init and run options (each named in the error), and
the bench's flag that feeds the engine's straggler policy."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import actorpy
from actorpy.barrier import BSP
from engines import param
from tests.param import problems as pb

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_callback_that_is_no_function_is_refused():
    # before: taken, then every worker or shard failed on "'int' object is not callable"
    job = param.Job("x")
    for role in ("schedule", "push", "pull", "barrier", "stop"):
        with pytest.raises(actorpy.ConfigError, match=f"^register_{role} must be a "
                                                      "function, got an int$"):
            getattr(job, f"register_{role}")(5)
    with pytest.raises(actorpy.ConfigError, match="^data must be a function, got a tuple$"):
        param.Job("x", data=(1, 2))


def test_a_barrier_class_for_its_instance_is_refused():
    # before: BSP (the class, whose decide is there too) was taken, and failed in the shard
    with pytest.raises(actorpy.ConfigError, match="barrier must be BSP.*got <class"):
        param.Job("x", barrier=BSP)
    assert isinstance(param.Job("x", barrier=BSP()).barrier, BSP)


def test_a_name_too_long_for_the_services_it_names_is_refused():
    # before: taken, then the run failed as its first shard registered its service name
    # (a RemoteError repeating the whole name)
    with pytest.raises(actorpy.ConfigError, match=r"^a job name has at most 150 "
                                                  r"characters .*, not 1,000: 'xxx"):
        param.Job("x" * 1000)
    assert param.Job("x" * 150).name == "x" * 150


def test_missing_callbacks_and_bad_init(cluster):
    job = param.Job("x")
    with pytest.raises(actorpy.ConfigError, match="register_push and register_pull"):
        job.run(cluster, init={"w": np.zeros(2)})
    job.register_push(pb.linear_push)
    job.register_pull(pb.SGDPull(0.1))
    with pytest.raises(actorpy.ConfigError, match="needs a stop condition"):
        job.run(cluster, init={"w": np.zeros(2)})
    job.register_stop(pb.StepStop(1))
    with pytest.raises(actorpy.ConfigError, match="numpy arrays or torch tensors"):
        job.run(cluster, init={"w": [0.0, 1.0]})
    # before: a TypeError from dict() ("cannot convert dictionary update sequence ...")
    for bad, what in ((np.zeros(2), r"a float64 array of shape \(2,\)"),
                      ([("w", np.zeros(2))], "a list"), (3, "an int")):
        with pytest.raises(actorpy.ConfigError, match=f"^init is {what}: it must be a dict "
                                                      "of key -> value"):
            job.run(cluster, init=bad)
    # before: taken, then every worker's first update did not fit "a object array"
    for bad in (np.array([1, "a"], dtype=object), np.array([[1.0, 2.0], [3.0]], dtype=object)):
        with pytest.raises(actorpy.ConfigError, match=r"init\['b'\] is an array of dtype "
                                                      r"object \(Python objects\)"):
            job.run(cluster, init={"w": np.zeros(2), "b": bad})
    for timeout in (float("nan"), float("inf")):   # before: nan waited "nan s", then
        with pytest.raises(actorpy.ConfigError, match="finite timeout_s"):  # failed;
            job.run(cluster, init={"w": np.zeros(2)}, timeout_s=timeout)  # inf: traceback
    # before: "need a finite timeout_s > 0 (got 600.0), batch >= 1 and checkpoint_every
    # >= 0", the one value shown not the one at fault
    # straggler_factor=0 turned the policy off without a word; NaN failed on the shard
    for bad in ({"batch": 0}, {"checkpoint_every": -1}, {"straggler_factor": 0},
                {"straggler_factor": -1.0}, {"straggler_factor": float("nan")},
                {"straggler_factor": float("inf")}):
        with pytest.raises(actorpy.ConfigError, match=f"{next(iter(bad))}="
                                                      f"{next(iter(bad.values()))}"):
            job.run(cluster, init={"w": np.zeros(2)}, **bad)
    with pytest.raises(actorpy.ConfigError, match="seed must be an int >= 0, got -1"):
        param.Job("x", seed=-1)   # before: numpy's ValueError on every worker
    # before: TypeErrors from a comparison and from range(); a lone surrogate key (a
    # file name decoded with surrogateescape) a UnicodeEncodeError from the shard plan
    with pytest.raises(actorpy.ConfigError, match="finite timeout_s > 0, got '5'"):
        job.run(cluster, init={"w": np.zeros(2)}, timeout_s="5")
    with pytest.raises(actorpy.ConfigError, match="servers must be an int >= 1, got 1.5"):
        job.run(cluster, init={"w": np.zeros(2)}, servers=1.5)
    with pytest.raises(actorpy.ConfigError, match=r"init key '\\ud800' is not valid "):
        job.run(cluster, init={"\ud800": np.zeros(2)})


@pytest.mark.parametrize("value, dtype", [
    (np.zeros(2, dtype=[("a", "f8"), ("b", "i4")]), r"\[\('a', '<f8'\), \('b', '<i4'\)\]"),
    (np.zeros(2, dtype="datetime64[s]"), "datetime64\\[s\\]"),
    (np.zeros(2, dtype="timedelta64[ms]"), "timedelta64\\[ms\\]"),
    (np.array(["ab", "c"]), "<U2"), (np.array([b"ab"]), "\\|S2"),
    (np.zeros(2, dtype="V4"), "\\|V4")],
    ids=["structured", "datetime64", "timedelta64", "str", "bytes", "void"])
def test_init_of_no_numeric_dtype_is_refused(cluster, value, dtype):
    # before: taken, then every worker or the shard failed in numpy's words (a structured
    # array: "ufunc 'multiply' did not contain a loop"), or a datetime key trained nothing
    job = param.Job("x")
    job.register_push(pb.linear_push)
    job.register_pull(pb.SGDPull(0.1))
    job.register_stop(pb.StepStop(1))
    with pytest.raises(actorpy.ConfigError, match=f"^init\\['b'\\] is a numpy array of dtype "
                                                  f"{dtype} \\(numeric dtypes only\\)"):
        job.run(cluster, init={"w": np.zeros(2), "b": value})


def test_a_sparse_or_quantized_torch_init_is_refused(cluster):
    # before: taken, then the shard failed in torch's words ("nbytes is not defined for
    # sparse tensors"; a quantized one: "promoteTypes with quantized numbers")
    torch = pytest.importorskip("torch")
    job = param.Job("x")
    job.register_push(lambda ctx, values: {})
    job.register_pull(pb.SGDPull(0.1))
    job.register_stop(pb.StepStop(1))
    with pytest.raises(actorpy.ConfigError, match=r"^init\['w'\] is a torch tensor of layout "
                                                  r"torch.sparse_coo \(dense tensors only\)"):
        job.run(cluster, init={"w": torch.zeros(4).to_sparse()})
    with warnings.catch_warnings():   # torch deprecates making them; users still have some
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch.quantize_per_tensor(torch.zeros(4), 0.1, 0, torch.quint8)
    with pytest.raises(actorpy.ConfigError, match=r"^init\['w'\] is a quantized torch tensor "
                                                  r"of dtype torch.quint8 \(unquantized"):
        job.run(cluster, init={"w": quantized})


def test_a_torch_init_that_requires_grad_is_refused(cluster):
    # before: taken, and the model returned required grad (each set a node of one autograd
    # graph); an nn.Parameter is the common case
    torch = pytest.importorskip("torch")
    job = param.Job("x")
    job.register_push(lambda ctx, values: {"w": torch.ones(4)})
    job.register_pull(pb.SGDPull(0.1))
    job.register_stop(pb.StepStop(1))
    for value in (torch.zeros(4, requires_grad=True), torch.nn.Parameter(torch.zeros(4))):
        with pytest.raises(actorpy.ConfigError, match=r"^init\['w'\] is a float32 tensor of "
                                                      r"shape \(4,\) that requires grad; .*"
                                                      r"\.detach\(\)"):
            job.run(cluster, init={"w": value}, timeout_s=30)


def _count_job(aggregate=None):
    job = param.Job("count") if aggregate is None else param.Job("count", aggregate=aggregate)
    job.register_push(lambda ctx, values: {"n": np.ones_like(values["n"])})
    job.register_pull(lambda store, updates: store.set("n", store.get("n")[0] + updates["n"]))
    job.register_stop(pb.StepStop(3))
    return job


def test_integer_and_bool_keys_under_mean_are_refused_and_sum_counts(cluster):
    # before: taken; a lone update passed through as it came, but a mean of two is a float
    # array, and pull's set of it failed with an UpdateError blaming pull, so the job
    # failed with 2 workers and ran with 1
    torch = pytest.importorskip("torch")
    for value in (np.zeros(4, np.int64), np.zeros(2, np.uint8), np.zeros(3, bool),
                  torch.zeros(4, dtype=torch.int64), torch.zeros(2, dtype=torch.bool)):
        for job in (_count_job(), _count_job("mean")):
            with pytest.raises(actorpy.ConfigError, match=r"^init\['n'\] is an? .*(int|uint|"
                                                          r"bool)\d* (array|tensor) of shape .*"
                                                          r"aggregate='mean'.*aggregate='sum'"):
                job.run(cluster, init={"w": np.zeros(2), "n": value}, timeout_s=30)
    for job in (_count_job("sum"), _count_job("each")):   # 3 rounds of 2 workers' ones
        n = job.run(cluster, init={"n": np.zeros(4, np.int64)}, timeout_s=30)["n"]
        assert n.dtype == np.int64 and n.tolist() == [6] * 4


def test_workers_that_are_no_list_or_name_a_worker_twice_are_said_so(cluster):
    job = param.Job("x")
    job.register_push(pb.linear_push)
    job.register_pull(pb.SGDPull(0.1))
    job.register_stop(pb.StepStop(1))
    one = cluster.workers()[0]
    # before: a str was made a tuple of its characters, and the error listed them one by one
    for option in ("workers", "server_nodes"):
        with pytest.raises(actorpy.ConfigError, match=f"^{option}= must be a list of worker "
                                                      f"ids, got a str: '{one}'"):
            job.run(cluster, init={"w": np.zeros(2)}, **{option: one})
    # before: "are not all live workers of the cluster", though both are
    with pytest.raises(actorpy.ConfigError, match=f"^workers=.* names '{one}' more than once"):
        job.run(cluster, init={"w": np.zeros(2)}, workers=[one, one])
    with pytest.raises(actorpy.ConfigError, match=f"^server_nodes=.* names '{one}' more than "
                                                  "once"):
        job.run(cluster, init={"w": np.zeros(2)}, server_nodes=[one, one])


def test_the_bench_release_factor_flag_refuses_what_the_engine_refuses():
    # before: -1 and NaN were taken (the runs with the policy then failed one by one,
    # after the ones without it); 0 still means "no runs with the policy"
    for bad in ("-1", "nan", "0.5"):
        out = subprocess.run([sys.executable, "bench/ps.py", "--release-factor", bad],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out.stderr
        assert "--release-factor: must be a finite number > 1, or 0" in out.stderr

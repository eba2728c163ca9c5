"""The store callbacks see: stable sharding, clocks, local keys, validated sets (and one job
whose model is big-endian)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from actorpy.errors import ConfigError
from engines import param
from engines.param.errors import KeyNotLocal, UpdateError
from engines.param.store import Progress, Store, check_update, plan_shards, shard_of


class TestStore:
    def test_shard_of_is_stable_across_processes(self):
        keys = [f"layer{i}/w" for i in range(20)]
        here = [shard_of(k, 3) for k in keys]
        code = ("from engines.param.store import shard_of;"
                f"print([shard_of(k, 3) for k in {keys!r}])")
        there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=True, env={"PYTHONHASHSEED": "123",
                                                "PYTHONPATH": ":".join(sys.path)}).stdout
        assert str(here) == there.strip() and len(set(here)) == 3

    def test_get_set_clock_and_locality(self):
        key_map = plan_shards(["a", "b"], 2)
        mine = {k for k, s in key_map.items() if s == 0}
        store = Store({k: np.zeros(2) for k in mine}, key_map, 0, Progress({"w1": 3, "w2": 5}))
        assert store.keys() == ["a", "b"] and store.worker_num() == 2 and store.step == 3
        for key in mine:
            store.set(key, np.ones(2))
            value, clock = store.get(key)
            assert clock == 1 and np.array_equal(value, np.ones(2))
        for key in set(key_map) - mine:
            with pytest.raises(KeyNotLocal, match=f"key '{key}' is held by server shard 1"):
                store.get(key)
        with pytest.raises(KeyError, match="no key 'zz'"):
            store.get("zz")

    def test_set_must_fit(self):
        store = Store({"w": np.zeros((2, 2))}, {"w": 0}, 0)
        with pytest.raises(UpdateError, match=r"pull set a value for key 'w' is a float64 array "
                                              r"of shape \(4,\)"):
            store.set("w", np.zeros(4))
        assert store.get("w")[1] == 0

    def test_a_zero_d_key_is_set_from_a_numpy_scalar(self):
        # before: refused, and w - 0.1 * u on a 0-d w gives one (np.float64, not an array)
        store = Store({"b": np.array(0.0), "n": np.array(0, np.int32)}, {"b": 0, "n": 0}, 0)
        store.set("b", store.get("b")[0] - 0.5)
        store.set("n", np.int32(3))
        for key, want, dtype in (("b", -0.5, np.float64), ("n", 3, np.int32)):
            value, clock = store.get(key)
            assert type(value) is np.ndarray and value.shape == () and value.dtype == dtype
            assert value == want and clock == 1 and not value.flags.writeable
        for bad, what in ((np.float32(1.0), "a float32"), (np.int64(1), "an int64"),
                          (1.0, "a float")):   # the dtype counts; a Python float has none
            with pytest.raises(UpdateError, match=f"is {what}, but the model's 'b' is a "
                                                  r"float64 array of shape \(\)"):
                store.set("b", bad)
        with pytest.raises(UpdateError, match="is a float64, but the model's 'w' is a float64 "
                                              r"array of shape \(1,\)"):   # 0-d keys only
            Store({"w": np.zeros(1)}, {"w": 0}, 0).set("w", np.float64(1.0))

    def test_init_must_be_arrays(self):
        with pytest.raises(ConfigError, match="wrap scalars"):
            Store({"b": 0.5}, {"b": 0}, 0)

    def test_a_big_endian_model_takes_native_order_values(self):
        # before: w + u on np.zeros(3, ">f8") is native "<f8", refused as another dtype
        store = Store({"w": np.zeros(3, dtype=">f8")}, {"w": 0}, 0)
        w, _ = store.get("w")
        check_update("w", w + 1, w, "the update from worker w1")
        store.set("w", w + np.arange(3.0))
        value, clock = store.get("w")
        assert clock == 1 and value.dtype.str == ">f8" and value.tolist() == [0.0, 1.0, 2.0]
        with pytest.raises(UpdateError, match="is a >f4 array of shape"):   # not a cast
            store.set("w", np.zeros(3, dtype=">f4"))


def _trained_toward_3(cluster, name: str, value: np.ndarray) -> np.ndarray:
    """A job whose pull moves ``value`` halfway to 3.0 a step, 20 steps: the final value."""
    job = param.Job(name, seed=0)
    job.register_push(lambda ctx, values: {"w": values["w"] - 3.0})
    job.register_pull(lambda store, updates: store.set("w", store.get("w")[0]
                                                       - 0.5 * updates["w"]))
    job.register_stop(lambda store: store.step >= 20)
    return job.run(cluster, init={"w": value}, timeout_s=60)["w"]


def test_a_job_on_a_big_endian_model_trains(cluster):
    w = _trained_toward_3(cluster, "big-endian", np.zeros(3, dtype=">f8"))
    assert w.dtype.str == ">f8" and np.allclose(w, 3.0)


def test_a_job_on_a_zero_d_key_trains(cluster):
    # before: push's v["w"] - 3.0 is a numpy scalar, refused by the shard as "a float64"
    w = _trained_toward_3(cluster, "zero-d", np.array(0.0))
    assert type(w) is np.ndarray and w.shape == () and w == pytest.approx(3.0, abs=1e-4)

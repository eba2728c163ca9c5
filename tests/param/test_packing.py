"""A message's small arrays of one dtype packed into one buffer (engines/param/packing.py):
round trips over the real wire (mixed dtypes, shapes, 0-d, non-contiguous, torch), the
shard's checks and averages by group, and whole jobs with many keys."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from actorpy.barrier import ASP, BSP
from actorpy.ids import NodeId
from actorpy.wire import serde
from engines import param
from engines.param.errors import UpdateError
from engines.param.kinds import Join, Push, Reply, Status
from engines.param.packing import PACK_MAX_BYTES, pack, unpack
from tests.param import problems as pb
from tests.param.harness import go, make_core

A, B = NodeId("a"), NodeId("b")


def _wire(value: Any) -> Any:
    """``value`` through the real encoder and decoder."""
    frames, has_layout = serde.encode(value)
    return serde.decode(frames, has_layout)


def _mixed() -> dict[str, Any]:
    base = np.arange(60, dtype=np.float64).reshape(6, 10)
    return {"a": np.arange(5, dtype=np.float32), "b": np.float32(2.5) * np.ones((2, 3), "f4"),
            "zero_d": np.array(7.0, dtype=np.float32), "empty": np.zeros((0, 4), np.float32),
            "transposed": base.T, "strided": base[::2, 1::3], "i": np.arange(4),
            "j": np.array([[1, 2]]), "flag": np.array([True, False]), "flag2": np.array(True),
            "c": np.array([1 + 2j], np.complex64), "lonely": np.ones(3, np.int8),
            "big": np.ones(PACK_MAX_BYTES // 4 + 1, np.float32)}


def test_mixed_dtypes_shapes_and_layouts_round_trip_in_order():
    values = _mixed()
    wired = pack(values)
    loose, groups, order = wired
    assert loose["big"] is values["big"]          # a large array is never copied
    assert set(loose) == {"big", "lonely", "c"}   # nor is the only one of its dtype
    assert len(groups) == 4   # float32, float64, int64, bool
    back, back_groups = unpack(_wire(wired))
    assert list(back) == list(values) and len(back_groups) == 4
    for key, value in values.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        np.testing.assert_array_equal(back[key], value)
    assert back["zero_d"].shape == () and float(back["zero_d"]) == 7.0


def test_a_byte_order_not_native_is_kept():
    # before: the packed buffer came back in the native order ("<f8" for ">f8"), and the
    # shard refused a push that matched a big-endian model (np.load of such files)
    values = {"p": np.arange(3, dtype=">f8"), "q": np.arange(4, dtype=">f8").reshape(2, 2)}
    (_, groups, _) = pack(values)
    assert len(groups) == 1
    back, _ = unpack(_wire(pack(values)))
    for key, value in values.items():
        assert back[key].dtype == np.dtype(">f8"), key
        np.testing.assert_array_equal(back[key], value)


def test_nothing_to_pack_is_the_plain_dict():
    one = {"w": np.zeros(1000, np.float32)}   # Job A: one key, exactly as before
    assert pack(one) is one
    odd = {"w": np.zeros(2), "n": np.zeros(2, np.float32), "s": "text", "x": None}
    assert pack(odd) is odd
    assert unpack(None) == ({}, ()) and unpack(odd) == (odd, ())


def test_object_and_string_arrays_travel_loose():
    values = {"a": np.zeros(2), "b": np.zeros(2), "o": np.array([1, "a"], dtype=object),
              "u": np.array(["x", "yz"])}
    loose, groups, _ = pack(values)
    assert set(loose) == {"o", "u"} and len(groups) == 1


def test_torch_tensors_round_trip_as_tensors():
    torch = pytest.importorskip("torch")
    square = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    values = {"w": square.t(), "b": torch.ones(4), "s": torch.tensor(3.0),
              "h": torch.ones(3, dtype=torch.bfloat16), "h2": torch.zeros(2, dtype=torch.bfloat16),
              "g": torch.ones(2, requires_grad=True), "n": np.ones(2), "n2": np.zeros(2)}
    wired = pack(values)
    assert set(wired[0]) == {"g"}   # a tensor needing grad keeps its own path
    back, _ = unpack(_wire(wired))
    assert list(back) == list(values)
    for key, value in values.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(back[key], value)
            continue
        assert isinstance(back[key], torch.Tensor), key
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        assert torch.equal(back[key], value.detach()), key
    assert back["s"].shape == () and back["w"][0, 1] == 4.0   # the transpose's values


def test_cuda_tensors_are_packed_from_the_cpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    values = {"a": torch.ones(3, device="cuda"), "b": torch.zeros(2, 2, device="cuda").t()}
    back, groups = unpack(_wire(pack(values)))
    assert len(groups) == 1
    for key, value in values.items():
        assert back[key].device.type == "cpu" and torch.equal(back[key], value.cpu()), key


def _packed_push(step: int, updates: dict[str, Any], batch: int = 1) -> Push:
    return Push.of((step, _wire(pack(updates)), batch, 0.1))


def _two_keys_core(policy: Any = BSP(), **config: Any) -> Any:
    init = {"p": np.zeros((2, 3), np.float32), "q": np.zeros(4, np.float32),
            "r": np.zeros(2, np.float64), "s": np.zeros(2, np.float64)}
    core = make_core(policy, ["a", "b"], init=init, **config)
    core.join(Join(A, 0, 0))
    core.join(Join(B, 0, 1))
    return core


def test_a_wrong_shape_in_a_packed_group_names_the_key_and_leaves_the_model():
    core = _two_keys_core(ASP())
    good = {"p": np.ones((2, 3), np.float32), "q": np.ones(4, np.float32),
            "r": np.ones(2), "s": np.ones(2)}
    assert go(core.push(A, _packed_push(1, good))) == {A: 1}   # checked, then remembered
    before = {k: v.copy() for k, v in core.store.values().items()}
    for bad in ({**good, "q": np.ones(5, np.float32)},          # another group signature
                {**good, "p": np.ones((3, 2), np.float32)},
                {**good, "r": np.ones(2, np.float32)}):         # dtype: another group
        with pytest.raises(UpdateError, match=r"for key '(q|p|r)' is a float32 array of shape "
                                              r"\((5,|3, 2|2,)\), but the model's"):
            core.push(A, _packed_push(2, bad))
        for key, value in core.store.values().items():
            np.testing.assert_array_equal(value, before[key])
    with pytest.raises(UpdateError, match="unknown key 'zz'"):
        core.push(A, _packed_push(2, {**good, "zz": np.ones(4, np.float32)}))


@pytest.mark.parametrize("aggregate", ["mean", "sum"])
def test_a_round_of_packed_updates_is_averaged_as_key_by_key(aggregate):
    core = _two_keys_core(BSP(), aggregate=aggregate)
    rng = np.random.default_rng(0)
    ups = [{"p": rng.normal(size=(2, 3)).astype(np.float32),
            "q": rng.normal(size=4).astype(np.float32)[::-1],
            "r": rng.normal(size=2), "s": rng.normal(size=2)} for _ in range(2)]
    assert core.push(A, _packed_push(1, ups[0], batch=3)) == []
    assert go(core.push(B, _packed_push(1, ups[1], batch=1))) == {A: 1, B: 1}
    for key in ups[0]:
        if aggregate == "sum":
            want = ups[0][key] + ups[1][key]
        else:   # the same operations as engines.param.aggregate._mean, key by key
            want = ups[0][key] * (3 / 4)
            want += ups[1][key] * (1 / 4)
        got = core.store.get(key)[0]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, -0.1 * want)   # sgd_pull's lr: bit for bit


def test_a_released_worker_gets_every_value_packed():
    core = _two_keys_core(ASP())
    out = core.push(A, _packed_push(1, {"p": np.ones((2, 3), np.float32)}))
    reply = next(a.reply for a in out if a.worker == A)
    assert reply.status == Status.GO
    wired = Reply(Status.GO, 1, reply.values).wire()
    back, _ = unpack(_wire(wired)[2])
    assert list(back) == ["p", "q", "r", "s"]
    np.testing.assert_array_equal(back["p"], np.full((2, 3), -0.1, np.float32))


# ------------------------------------------------------------------ whole jobs
class ConstantPush:
    """Every key's update: ones times (slot + 1), as the value's own type and shape; the
    values received must be the model's (checked against the step)."""

    def __call__(self, ctx: Any, values: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, value in values.items():
            if type(value).__module__.startswith("torch"):
                import torch
                out[key] = torch.ones_like(value) * (ctx.slot + 1)
                if value.dim() == 2:   # non-contiguous, as a transpose would be
                    out[key] = (torch.ones_like(value.t()) * (ctx.slot + 1)).t()
            else:
                out[key] = np.full_like(value, ctx.slot + 1)
                if value.ndim == 2:
                    out[key] = np.asfortranarray(out[key])
        return out


class Pull:
    """``w - lr * update`` for every key, kept an array (a 0-d one's difference is a numpy
    scalar)."""

    def __call__(self, store: Any, updates: dict[str, Any]) -> None:
        for key, update in updates.items():
            value, _ = store.get(key)
            new = value - 0.1 * update
            store.set(key, np.asarray(new, value.dtype) if isinstance(value, np.ndarray) else new)


def _model() -> dict[str, Any]:
    model = {f"layer{i:03d}": np.zeros(10 + i % 7, np.float32) for i in range(200)}
    model.update({f"m{i}": np.zeros((3, 4)) for i in range(5)})
    model.update({"bias": np.zeros((), np.float32), "big": np.zeros(30_000, np.float32)})
    return model


@pytest.mark.parametrize("servers", [1, 2])
def test_a_bsp_job_of_many_mixed_keys(cluster, servers):
    job = param.Job("many-keys", barrier=BSP(), seed=3)
    job.register_push(ConstantPush())
    job.register_pull(Pull())
    job.register_stop(pb.StepStop(4))
    init = _model()
    model = job.run(cluster, init=init, servers=servers, timeout_s=60)
    assert set(model) == set(init)
    for key, value in init.items():   # 4 rounds of the mean update 1.5, lr 0.1
        assert model[key].dtype == value.dtype and model[key].shape == value.shape, key
        np.testing.assert_allclose(model[key], np.full(value.shape, -0.6), rtol=1e-6)


def test_a_job_of_many_torch_tensors(cluster):
    torch = pytest.importorskip("torch")
    job = param.Job("many-tensors", barrier=BSP(), seed=3)
    job.register_push(ConstantPush())
    job.register_pull(Pull())
    job.register_stop(pb.StepStop(3))
    init = {f"t{i}": torch.zeros(4, 3) for i in range(30)}
    init.update({"s": torch.zeros(()), "d": torch.zeros(5, dtype=torch.float64)})
    model = job.run(cluster, init=init, timeout_s=60)
    for key, value in init.items():
        assert isinstance(model[key], torch.Tensor) and model[key].dtype == value.dtype, key
        assert torch.allclose(model[key], torch.full(value.shape, -0.45, dtype=value.dtype))

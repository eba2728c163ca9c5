"""Checkpoints: atomic writes, exact round trips, and refusal (whole) of corrupt or foreign
files."""
from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

from engines.param import checkpoint
from engines.param.checkpoint import Snapshot
from engines.param.errors import CheckpointError

KW = dict(job="lin", shard=0, shards=1)


def _snap(**values):
    values = values or {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(1)}
    return Snapshot(values, {k: i + 1 for i, k in enumerate(sorted(values))},
                    {"w-1": 7}, 5, 40, 9)


class TestCheckpoint:
    def test_round_trip_and_nothing_left_behind(self, tmp_path):
        path = checkpoint.path_for(str(tmp_path), "lin", 0, 1)
        snap = _snap()
        assert checkpoint.save(path, snap, **KW) > 0
        assert os.listdir(tmp_path) == [os.path.basename(path)]
        back = checkpoint.load(path, like=snap.values, **KW)
        for key, value in snap.values.items():
            assert np.array_equal(back.values[key], value)
            assert back.values[key].dtype == value.dtype
        assert (back.clocks, back.steps, back.base_step, back.updates, back.pulls) == \
            (snap.clocks, {"w-1": 7}, 5, 40, 9)

    def test_job_names_that_differ_have_files_that_differ(self, tmp_path):
        # before: every character outside [A-Za-z0-9_.-] became "_", so 训练 and 测试 (or
        # "run a" and "run/a") shared one checkpoint and overwrote each other's
        names = ["训练", "测试", "run a", "run/a", "run_a", ".", "..", "", "lin"]
        paths = [checkpoint.path_for(str(tmp_path), n, 0, 1) for n in names]
        assert len(set(paths)) == len(names)
        assert all(os.path.dirname(p) == str(tmp_path) for p in paths)
        # a name that is a safe file name keeps it (its checkpoints resume as before)
        assert paths[4].endswith("/run_a.shard0of1.npz")
        assert paths[-1].endswith("/lin.shard0of1.npz")

    def test_a_killed_writers_temporary_file_is_removed_by_the_next_save(self, tmp_path):
        # before: a shard killed while it wrote left a model-sized .tmp file for good
        path = checkpoint.path_for(str(tmp_path), "lin", 0, 1)
        stale = tmp_path / f".{os.path.basename(path)}.999999.tmp"
        stale.write_bytes(b"half a model")
        other = tmp_path / ".other.npz.999999.tmp"      # another shard's: not ours to touch
        other.write_bytes(b"x")
        checkpoint.save(path, _snap(w=np.zeros(3)), **KW)
        assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(path), other.name])

    def test_round_trip_of_a_0d_and_a_non_contiguous_key(self, tmp_path):
        # before: a 0-d key was written as shape (1,) and its own checkpoint was refused as
        # corrupt ("the shape of key 'z' is [], not its data's")
        path = str(tmp_path / "c.npz")
        values = {"z": np.array(5.0), "t": np.arange(6.0).reshape(2, 3).T}
        checkpoint.save(path, _snap(**values), **KW)
        back = checkpoint.load(path, like=values, **KW)
        for key, value in values.items():
            assert back.values[key].shape == value.shape
            assert np.array_equal(back.values[key], value)

    def test_torch_round_trip(self, tmp_path):
        torch = pytest.importorskip("torch")
        path = str(tmp_path / "t.npz")
        values = {"w": torch.randn(3, 4, generator=torch.Generator().manual_seed(0)),
                  "h": torch.ones(2, dtype=torch.bfloat16)}
        checkpoint.save(path, Snapshot(values, {"w": 0, "h": 3}), **KW)
        back = checkpoint.load(path, like=values, **KW)
        assert torch.equal(back.values["w"], values["w"])
        assert back.values["h"].dtype == torch.bfloat16 and back.clocks["h"] == 3

    def test_rewrite_replaces_atomically(self, tmp_path):
        path = str(tmp_path / "c.npz")
        checkpoint.save(path, _snap(w=np.zeros(3)), **KW)
        checkpoint.save(path, _snap(w=np.ones(3)), **KW)
        assert np.array_equal(checkpoint.load(path, like={"w": np.zeros(3)}, **KW).values["w"],
                              np.ones(3))

    @pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
    def test_corrupt_file_is_refused(self, tmp_path, damage):
        path = str(tmp_path / "c.npz")
        values = {"w": np.arange(1000, dtype=np.float64)}
        checkpoint.save(path, Snapshot(values, {"w": 1}), **KW)
        data = bytearray(open(path, "rb").read())
        if damage == "flip":
            data[len(data) // 3] ^= 0xFF          # inside the array's bytes
        elif damage == "truncate":
            data = data[: len(data) // 2]
        else:
            data = bytearray(b"not a checkpoint at all")
        open(path, "wb").write(bytes(data))
        with pytest.raises(CheckpointError, match="corrupt|not a checkpoint|digest") as err:
            checkpoint.load(path, like=values, **KW)
        # before: garbage came with numpy's advice to load the file unpickled
        assert "allow_pickle" not in str(err.value) and "pickle.load" not in str(err.value)

    def test_a_checkpoint_path_that_is_no_regular_file_is_refused_not_opened(self, tmp_path):
        path = str(tmp_path / "c.npz")
        os.mkfifo(path)    # before: np.load's open waited for a writer for ever
        with pytest.raises(CheckpointError, match="is not a regular file"):
            checkpoint.load(path, like={"w": np.zeros(3)}, **KW)

    @pytest.mark.parametrize("like, kw, words", [
        ({"w": np.zeros(3)}, dict(job="other", shard=0, shards=1), "belongs to job 'lin'"),
        ({"w": np.zeros(3)}, dict(job="lin", shard=0, shards=2), "resume with servers=1"),
        ({"v": np.zeros(3)}, KW, "another model"),
        ({"w": np.zeros(4)}, KW, r"shape \(3,\)"),
        ({"w": np.zeros(3, dtype=np.float32)}, KW, "float32"),
    ])
    def test_foreign_checkpoint_is_refused(self, tmp_path, like, kw, words):
        path = str(tmp_path / "c.npz")
        checkpoint.save(path, Snapshot({"w": np.zeros(3)}, {"w": 0}), **KW)
        with pytest.raises(CheckpointError, match=words):
            checkpoint.load(path, like=like, **kw)

    def test_other_npz_and_missing_file(self, tmp_path):
        path = str(tmp_path / "c.npz")
        np.savez(path, a=np.zeros(2))
        with pytest.raises(CheckpointError, match="corrupt or not a checkpoint"):
            checkpoint.load(path, like={"a": np.zeros(2)}, **KW)
        with pytest.raises(CheckpointError, match="no checkpoint at"):
            checkpoint.load(str(tmp_path / "none.npz"), like={}, **KW)

    def test_pickled_members_are_never_loaded(self, tmp_path):
        path = str(tmp_path / "c.npz")
        checkpoint.save(path, Snapshot({"w": np.zeros(2)}, {"w": 0}), **KW)
        with zipfile.ZipFile(path) as z:        # rebuild it with v0 an object array (a pickle)
            members = {n: z.read(n) for n in z.namelist()}
        members["v0.npy"] = _npy_bytes(np.array([{"x": 1}], dtype=object))
        with zipfile.ZipFile(path, "w") as z:
            for name, data in members.items():
                z.writestr(name, data)
        with pytest.raises(CheckpointError, match="corrupt or not a checkpoint") as err:
            checkpoint.load(path, like={"w": np.zeros(2)}, **KW)
        assert "would need unpickling" in str(err.value) and "allow_pickle" not in str(err.value)

    @pytest.mark.parametrize("tamper", [
        lambda m: m["keys"][0].pop("sha256"),
        lambda m: m["keys"][0].update(clock="soon"),
        lambda m: m["keys"][0].update(family="torch", dtype="float64", shape=[5, 5]),
        lambda m: m.update(steps=[1, 2]),
        lambda m: m.update(steps={"w-1": "many"}),
        lambda m: m.update(keys=[["w"]]),
        lambda m: m.update(base_step=None),
    ])
    def test_a_malformed_description_is_refused_whole(self, tmp_path, tamper):
        """A file with our format's marker and the right job, whose description a writer
        of ours never wrote: refused as corrupt (before, a KeyError, TypeError or
        ValueError escaped from the load)."""
        self._refused(tmp_path, tamper, "corrupt or not a checkpoint")

    @pytest.mark.parametrize("field, tamper, shown", [
        ("base_step", lambda m: m.update(base_step=10**30), str(10**30)),
        ("base_step", lambda m: m.update(base_step=1.5), "1.5"),
        ("base_step", lambda m: m.update(base_step=-1), "-1"),
        ("base_step", lambda m: m.update(base_step=True), "True"),
        ("updates", lambda m: m.update(updates=-1), "-1"),
        ("pulls", lambda m: m.update(pulls=2**62), str(2**62)),
        ("the clock of key 'w'", lambda m: m["keys"][0].update(clock=-5), "-5"),
        ("the clock of key 'w'", lambda m: m["keys"][0].update(clock=10**30), str(10**30)),
        ("the step count of worker 'w-1'", lambda m: m.update(steps={"w-1": -100}), "-100"),
        ("the step count of worker 'w-1'", lambda m: m.update(steps={"w-1": 10**20}), str(10**20)),
        ("the shape of key 'w'", lambda m: m["keys"][0].update(shape="100"), "'100'"),
        ("the shape of key 'w'", lambda m: m["keys"][0].update(shape=[3]), r"\[3\]"),
        ("the dtype of key 'w'", lambda m: m["keys"][0].update(dtype="nonsense"), "'nonsense'"),
        ("a key", lambda m: m["keys"][0].update(key=5), "5"),
    ])
    def test_counts_and_descriptions_out_of_range_are_refused_whole(self, tmp_path, field,
                                                                    tamper, shown):
        """Before: a base_step of 1e30 was taken (every worker's steps counted from it), 1.5
        truncated, negative counts, clocks and worker steps taken, and a numpy key's shape
        and dtype not compared with its data."""
        self._refused(tmp_path, tamper, f"corrupt or not a checkpoint \\(its description is "
                                        f"malformed: {field} is {shown}")

    @staticmethod
    def _refused(tmp_path, tamper, words):
        path = str(tmp_path / "c.npz")
        checkpoint.save(path, Snapshot({"w": np.zeros(2)}, {"w": 0}, {"w-1": 3}), **KW)
        with np.load(path) as npz:
            members = {name: npz[name] for name in npz.files}
        meta = json.loads(bytes(members["meta"]).decode())
        tamper(meta)
        members["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        np.savez(path, **members)
        with pytest.raises(CheckpointError, match=words):
            checkpoint.load(path, like={"w": np.zeros(2)}, **KW)


def _npy_bytes(array):
    import io
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()

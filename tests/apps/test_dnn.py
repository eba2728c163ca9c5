"""`actorpy dnn`: a torch MLP or CNN on the bundled digits through the parameter server; MNIST idx
reading."""
from __future__ import annotations

import gzip
import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest

from actorpy.errors import ConfigError

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from apps import dnn  # noqa: E402


def _idx(array: np.ndarray) -> bytes:
    head = bytes([0, 0, 0x08, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return head + array.astype(np.uint8).tobytes()


class TestDNN:
    def test_trains_on_digits(self, capsys):
        assert dnn.main(["--steps", "150", "--barrier", "ssp", "--staleness", "2",
                         "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert set(result) == {"accuracy", "loss", "steps_per_worker", "updates", "seconds"}
        assert result["accuracy"] > 0.8 and min(result["steps_per_worker"]) >= 150
        assert "diverged" not in capsys.readouterr().err

    def test_a_diverged_run_says_so(self, capsys):
        # before: a loss of 12.9 (569677 at --lr 1e6) went without a word, as sgd's does not
        assert dnn.main(["--lr", "50", "--steps", "30", "--json"]) == 0
        captured = capsys.readouterr()
        assert json.loads(captured.out)["loss"] > 2 * math.log(10)
        assert "actorpy dnn: bsp: training diverged (loss " in captured.err
        assert "try a smaller --lr" in captured.err

    def test_trains_a_cnn(self, capsys):
        assert dnn.main(["--model", "cnn", "--steps", "150", "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["accuracy"] > 0.8 and result["updates"] == 300

    def test_cuda_without_a_gpu_is_a_clear_error(self):
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            dnn.main(["--device", "cuda", "--steps", "10"])

    def test_trains_on_the_gpu(self, capsys):
        """Workers compute on the GPU, the server folds gradients on the CPU: the same
        accuracy as on the CPU (run where torch sees a GPU)."""
        import torch

        if not torch.cuda.is_available():
            pytest.skip("no CUDA GPU")
        results = {}
        for device in ("cpu", "cuda"):
            assert dnn.main(["--model", "cnn", "--steps", "150", "--device", device,
                             "--barrier", "bsp", "--json"]) == 0
            results[device] = json.loads(capsys.readouterr().out)
        assert results["cuda"]["accuracy"] > 0.8
        assert abs(results["cuda"]["accuracy"] - results["cpu"]["accuracy"]) < 0.05

    def test_reads_mnist_idx_files(self, tmp_path):
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (5, 28, 28))
        labels = rng.integers(0, 10, 5)
        (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(images)))
        (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(_idx(labels))
        x, y = dnn.load("test", str(tmp_path))
        assert x.shape == (5, 784) and x.dtype == np.float32 and x.max() <= 1.0
        assert np.array_equal(y, labels)
        (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(_idx(labels)[:-2])
        with pytest.raises(ConfigError, match="truncated"):
            dnn.load("test", str(tmp_path))
        # before: "is truncated" for a file longer than its header says
        (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(_idx(labels) + b"\0\0")
        with pytest.raises(ConfigError, match="holds 7 values, more than its header's shape "
                                              "\\(5,\\) takes \\(5\\)"):
            dnn.load("test", str(tmp_path))
        # no values, dimensions numpy cannot index: before, a ValueError traceback
        huge = bytes([0, 0, 0x08, 3]) + b"".join(d.to_bytes(4, "big")
                                                 for d in (2**32 - 1, 2**32 - 1, 0))
        (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(huge)
        with pytest.raises(ConfigError, match="not an idx file numpy can hold"):
            dnn.load("test", str(tmp_path))
        many = bytes([0, 0, 0x08, 200]) + b"\0\0\0\1" * 200 + b"\7"
        for data, words in ((many, "numpy can hold"), (many[:-1], "truncated")):
            (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(data)   # 200 dims, numpy's max 64
            with pytest.raises(ConfigError, match=words) as err:
                dnn.read_idx(str(tmp_path / "t10k-labels-idx1-ubyte"))
            # before: all 200 dimensions in the line (a traceback for the first)
            assert "of 200 dimensions (1, 1, 1, 1)..." in str(err.value)
            assert len(str(err.value)) < 250
        with pytest.raises(ConfigError, match="train-images-idx3-ubyte"):
            dnn.load("train", str(tmp_path))

    def test_every_worker_gets_images_when_there_are_fewer_than_workers(self, tmp_path):
        # before: a worker past the images got none, and its first step failed on the
        # worker ("ValueError: high <= 0")
        rng = np.random.default_rng(0)
        (tmp_path / "train-images-idx3-ubyte").write_bytes(_idx(rng.integers(0, 256, (3, 4, 4))))
        (tmp_path / "train-labels-idx1-ubyte").write_bytes(_idx(np.array([0, 1, 2])))
        data = dnn.Data(str(tmp_path), hidden=4)
        got = [data(SimpleNamespace(slot=slot, slots=5)).y.tolist() for slot in range(5)]
        assert got == [[0], [1], [2], [0], [1]]
        got = [data(SimpleNamespace(slot=slot, slots=2)).y.tolist() for slot in range(2)]
        assert got == [[0, 2], [1]]      # as before with enough images

    @pytest.mark.parametrize("case, words", [
        ("fewer labels", "images of shape \\(20, 28, 28\\) and train-labels-idx1-ubyte labels "
                         "of shape \\(15,\\)"),
        ("a label of 200", "holds label 200; the networks here tell the digits 0-9 apart"),
        ("a cut .gz", "cannot read .*train-images-idx3-ubyte.gz: Compressed file ended"),
        ("a header of 255 dimensions", "its header says 255 dimensions in 8 bytes"),
        ("test images of another size", "training images have 784 pixels, test images 400"),
        ("images 10x20 for the cnn", "--model cnn needs square images, and 200 pixels"),
        ("images 1x1 for the cnn", "--model cnn needs images of at least 2x2 pixels \\(its "
                                   "2x2 max pooling\\), and these are 1x1; use --model mlp"),
        ("a FIFO for the training labels", "train-labels-idx1-ubyte is not a regular file"),
        ("no test images", "t10k-images-idx3-ubyte holds no pixels \\(images of shape "
                           "\\(0, 28, 28\\)\\); nothing to train or test on"),
    ])
    def test_a_bad_data_dir_is_refused_before_anything_starts(self, tmp_path, case, words):
        # before: each failed on every worker in torch's or gzip's words (exit 1), or, with
        # fewer labels than images, trained on what it had; 1x1 images for the cnn failed
        # in torch's words after the workers had started ("Output size is too small")
        rng = np.random.default_rng(0)
        side = {"images 10x20 for the cnn": (10, 20),
                "images 1x1 for the cnn": (1, 1)}.get(case, (28, 28))
        files = {"train-images-idx3-ubyte": _idx(rng.integers(0, 256, (20, *side))),
                 "train-labels-idx1-ubyte": _idx(rng.integers(0, 10, 20)),
                 "t10k-images-idx3-ubyte": _idx(rng.integers(0, 256, (5, *side))),
                 "t10k-labels-idx1-ubyte": _idx(rng.integers(0, 10, 5))}
        if case == "fewer labels":
            files["train-labels-idx1-ubyte"] = _idx(rng.integers(0, 10, 15))
        elif case == "a label of 200":
            files["train-labels-idx1-ubyte"] = _idx(np.full(20, 200))
        elif case == "a header of 255 dimensions":
            files["train-images-idx3-ubyte"] = bytes([0, 0, 0x08, 255, 0, 0, 0, 1])
        elif case == "no test images":   # before: a ValueError traceback from reshape
            files["t10k-images-idx3-ubyte"] = _idx(np.zeros((0, 28, 28), dtype=np.uint8))
            files["t10k-labels-idx1-ubyte"] = _idx(np.zeros(0, dtype=np.uint8))
        elif case == "a FIFO for the training labels":
            os.mkfifo(tmp_path / "train-labels-idx1-ubyte")   # before: read, waiting for ever
            del files["train-labels-idx1-ubyte"]
        elif case == "test images of another size":
            files["t10k-images-idx3-ubyte"] = _idx(rng.integers(0, 256, (5, 20, 20)))
        for name, data in files.items():
            if case == "a cut .gz" and name == "train-images-idx3-ubyte":
                (tmp_path / (name + ".gz")).write_bytes(gzip.compress(data)[:100])
            else:
                (tmp_path / name).write_bytes(data)
        with pytest.raises(ConfigError, match=words):
            dnn.main(["--data", str(tmp_path), "--model", "cnn", "--workers", "0"])

    @pytest.mark.parametrize("target", ["nan", "2", "0", "-0.5"])
    def test_a_target_no_accuracy_can_reach_is_refused(self, target):
        # before: taken, and the run went on to --steps without ever stopping early
        with pytest.raises(ConfigError, match="--target is a test accuracy in \\(0, 1\\]"):
            dnn.main(["--target", target, "--workers", "0"])


@pytest.mark.parametrize("what, words", [("a file", "not a directory"),
                                         ("nothing", "no such directory")])
def test_data_that_is_no_directory_is_named_so(tmp_path, what, words):
    # before: "train-images-idx3-ubyte[.gz] is missing", as if the directory were there
    path = tmp_path / "digits.txt"
    if what == "a file":
        path.write_text("1,2,3\n")
    with pytest.raises(ConfigError, match=f"--data {path}: {words}; name the directory"):
        dnn.main(["--data", str(path), "--workers", "0"])

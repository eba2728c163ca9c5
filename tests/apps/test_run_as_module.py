"""``python -m apps.NAME`` runs as ``actorpy NAME`` does: the same error lines and statuses,
and the parameter-server apps' callbacks reach the workers."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", f"apps.{name}", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})


@pytest.mark.parametrize("module, command, args", [
    ("sgd", "sgd", ["--workers", "0"]),
    ("p2p_sgd", "p2p-sgd", ["--workers", "0"]),
    ("kmeans", "kmeans", ["--workers", "0"]),
    ("wordcount", "wordcount", ["--workers", "0", "README.md"]),
])
def test_a_bad_flag_is_one_line_as_from_the_command(module, command, args):
    # before: a ConfigError traceback, exit status 1
    out = _module(module, *args)
    assert (out.returncode, out.stderr) == (2, f"actorpy {command}: --workers must be at "
                                               "least 1\n")


def test_the_sgd_module_trains():
    # before: run as __main__ its parameter server's callbacks were pickled by value, and
    # one holds a ContextVar: "cannot serialize ... __main__.Pull object", a traceback
    out = _module("sgd", "--workers", "1", "--steps", "5", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["steps_per_worker"] == [5]

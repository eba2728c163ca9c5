"""Every script in examples/ runs as-is and prints something (a newcomer copies them)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
#: the Kademlia simulations take ~18 s of CPU; at a load of 14 on 2 cores one took 268 s
SCRIPT_S = 300


def test_there_are_examples():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
@pytest.mark.timeout(SCRIPT_S + 20)
def test_example_runs(script, tmp_path):
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=SCRIPT_S, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(out.stdout.strip().splitlines()) >= 2

"""Every Python example in README.md runs as printed (a newcomer copies them)."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"),
                    re.S)
#: the Kademlia simulation (500 nodes) took 8 s in a suite at a load of 12 on 2 cores, and
#: over 120 s at 15 (examples/kademlia_overlay.py: 18 s of CPU, 268 s of wall time at 14)
SCRIPT_S = 300


def test_readme_has_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
@pytest.mark.timeout(SCRIPT_S + 20)
def test_readme_example_runs(index, tmp_path):
    script = tmp_path / f"example_{index}.py"
    script.write_text(BLOCKS[index], encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=SCRIPT_S, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip(), "an example should print what it shows"

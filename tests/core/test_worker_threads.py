"""Each worker of the embedded cluster gets its share of the cores for BLAS/OpenMP threads
(runtime/local.py: blas_threads), forked or spawned, unless the user set the variables."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from actorpy.runtime.local import THREAD_VARS, blas_threads

DRIVER = """
import os, actorpy
with actorpy.connect(workers=2) as c:
    seen = c.map(lambda _: [os.environ.get(v) for v in %r], range(4), timeout_s=60)
print("SEEN", sorted({"/".join(map(str, s)) for s in seen}))
""" % (THREAD_VARS,)


def _run(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", DRIVER], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("SEEN"))
    return line.removeprefix("SEEN ")


def test_share_of_the_cores() -> None:
    cores = len(os.sched_getaffinity(0))
    assert blas_threads(1) == cores
    assert blas_threads(2) == max(1, cores // 2)
    assert blas_threads(10 * cores) == 1
    assert blas_threads(0) == cores


@pytest.mark.parametrize("start", ["auto", "spawn"])
def test_workers_get_their_share(start: str) -> None:
    share = str(blas_threads(2))
    assert _run({"ACTORPY_LOCAL_START": start}) == repr(["/".join([share] * 3)])


def test_a_users_choice_is_kept() -> None:
    seen = _run({"OPENBLAS_NUM_THREADS": "3"})
    share = str(blas_threads(2))
    assert seen == repr([f"{share}/3/{share}"])

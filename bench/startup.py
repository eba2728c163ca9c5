"""Start-up and tear-down time of the embedded local cluster.

Compares, in one run, ``actorpy.connect(workers=N)`` (manager + N workers up and registered,
driver joined) and ``terminate()`` against two baselines: the floor — N + 1 bare Python
processes that import the same libraries and exit — and ``concurrent.futures``'
ProcessPoolExecutor with N processes made ready by one trivial task each (on Linux it forks,
so it skips interpreter start-up and imports entirely: a reference, not a fair floor).

Run: ``.venv/bin/python bench/startup.py [--workers 2] [--repeat 5]``
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor


def _floor(n: int) -> float:
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", "import zmq, numpy, cloudpickle"])
             for _ in range(n + 1)]
    for p in procs:
        p.wait()
    return time.perf_counter() - t0


def _pool(n: int) -> float:
    t0 = time.perf_counter()
    with ProcessPoolExecutor(n) as pool:
        list(pool.map(abs, range(n)))
        return time.perf_counter() - t0


def _actorpy(n: int) -> tuple[float, float]:
    import actorpy

    t0 = time.perf_counter()
    cluster = actorpy.connect(workers=n)
    assert len(cluster.workers()) == n
    up = time.perf_counter() - t0
    t1 = time.perf_counter()
    cluster.terminate()
    return up, time.perf_counter() - t1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    n = args.workers
    floor = statistics.median(_floor(n) for _ in range(args.repeat))
    pool = statistics.median(_pool(n) for _ in range(args.repeat))
    runs = [_actorpy(n) for _ in range(args.repeat)]
    up = statistics.median(r[0] for r in runs)
    down = statistics.median(r[1] for r in runs)
    print(f"local cluster start-up, {n} workers, median of {args.repeat}")
    print(f"{'what':<44} {'seconds':>8} {'vs floor':>9}")
    for name, value in [(f"floor: {n + 1} python procs importing zmq+numpy", floor),
                        (f"ProcessPoolExecutor({n}) ready", pool),
                        ("actorpy.connect(): cluster up, driver joined", up),
                        ("actorpy terminate(): all processes gone", down)]:
        print(f"{name:<44} {value:>8.3f} {value / floor:>8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

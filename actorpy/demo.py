"""What `actorpy demo` runs on an embedded local cluster."""
from __future__ import annotations

import time


def _square_sum(lo: int, hi: int) -> int:
    return sum(i * i for i in range(lo, hi))



def run_demo(workers: int = 2) -> int:
    import actorpy

    t0 = time.perf_counter()
    with actorpy.connect(workers=workers) as cluster:
        started = time.perf_counter() - t0
        print(f"started {cluster!r} in {started:.2f} s")
        for row in cluster.nodes():
            print(f"  {row['role']:<7} {row['node_id']:<16} pid {row['pid']}")

        n = 2_000_000
        chunks = [(lo, min(lo + n // 8, n)) for lo in range(0, n, n // 8)]
        total = sum(cluster.map(lambda c: _square_sum(*c), chunks, timeout_s=60))
        assert total == sum(i * i for i in range(n))
        print(f"sum of squares below {n:,} over {len(chunks)} tasks: {total}")

        import numpy as np   # not before connect(): a driver with numpy's threads spawns its
        # cluster instead of forking it (0.5 s to start instead of 0.05 s)

        a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
        for worker in cluster.workers():   # each loads numpy first: 0.2 s not to be timed
            cluster.submit_to(worker, np.sum, a[:1]).result(timeout=60)
        t1 = time.perf_counter()
        back = cluster.submit(lambda m: m @ m.T, a).result(timeout=60)
        print(f"a 4 MiB array went to a worker and back as a product in "
              f"{(time.perf_counter() - t1) * 1000:.1f} ms; max error "
              f"{float(np.abs(back - a @ a.T).max()):.2e}")

        try:
            cluster.submit(lambda: 1 / 0).result(timeout=30)
        except actorpy.RemoteError as exc:
            print(f"a remote failure comes back with its type, node and traceback: "
                  f"{exc.remote_type} on {exc.node_id}")
    print("cluster stopped; no processes left behind")
    _barrier_demo()
    _plugin_demos()
    return 0


def _barrier_demo(workers: int = 200, seconds: float = 200.0) -> None:
    from actorpy.barrier import ASP, BSP, PSP, SSP, SimConfig, simulate

    print(f"\nbarriers, simulated: {workers} workers, {seconds:.0f} s, "
          "iteration times exponential with mean 1 s")
    print(f"  {'barrier':<30} {'mean steps':>10} {'spread':>7} {'/ASP':>6}")
    config = SimConfig(workers=workers, seconds=seconds, seed=0)
    results = [(p, simulate(p, config)) for p in
               (BSP(), SSP(staleness=4), PSP(sample=10, staleness=0),
                PSP(sample=10, staleness=4), ASP())]
    asp_mean = results[-1][1].stats()["mean"]
    for policy, result in results:
        st = result.stats()
        print(f"  {policy!r:<30} {st['mean']:>10.1f} {st['max'] - st['min']:>7.0f} "
              f"{st['mean'] / asp_mean:>6.2f}")
    print("  (try `actorpy sim --compare bsp ssp:4 pbsp:10 pssp:10:4 asp --plot steps.png`)")



def _plugin_demos() -> None:
    """Sections that apps add under the ``actorpy.demo`` entry-point group (the core names
    no engine; packaging wires them in)."""
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group="actorpy.demo"), key=lambda e: e.name):
        entry.load()()

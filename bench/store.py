"""Object-store benchmark: put / fetch throughput in memory and when spilling, peak RSS while
four times the budget is stored, and the cost of delete(prefix) as the store grows.

Run:  python bench/store.py [--budget-mb 256] [--quick]

Sections:

1. In one process (an ``ObjectStore``, no sockets): ``put`` of 4 MB float64 arrays and
   ``put_stream`` of (str, int) records, with a budget that holds everything ("memory") and
   with budget 0 ("spill": every segment goes to a file); then ``get`` / ``iterate`` of the
   same. GB/s counts the stored (pickled) bytes.
2. ``delete(prefix)`` of one job's 100 keys in stores holding 1k .. 100k keys (keys
   ``job-J/stage-S/part-P``), against the scan the old dict store did.
3. A real local cluster of two workers with ``store_budget_bytes = budget``: worker A stores
   4 MB arrays up to the budget, then 4x the budget more (spilled), then 4x the budget of
   records with ``put_stream``; worker B fetches the arrays (one ``fetch`` at a time) and
   reads the records with ``fetch_iter``. Printed: throughput of each, and the peak RSS
   (VmHWM) of A while 8x the budget sits in its store, beside the bytes stored.

Nothing is asserted; the lead runs the full size on a quiet machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import actorpy  # noqa: E402
from actorpy.runtime.store import ObjectStore  # noqa: E402

MB = 1 << 20
BLOCK = 4 * MB


def rss_mb(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def records(n: int, start: int = 0):
    return ((f"{(i * 2654435761) % 10**9:09d}", i) for i in range(start, start + n))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# --------------------------------------------------------------------------- 1. one process
def local_throughput(total_mb: int) -> None:
    print(f"1. ObjectStore in one process ({total_mb} MB per row; GB/s of stored bytes)")
    print(f"{'what':<30} {'memory GB/s':>12} {'spill GB/s':>12}")
    n_blocks = max(1, total_mb * MB // BLOCK)
    arrays = [np.full(BLOCK // 8, i, dtype=np.float64) for i in range(n_blocks)]
    n_records = total_mb * MB // 18  # ~18 pickled bytes per record
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="actorpy-bench-store-") as where:
        for mode, budget in (("memory", 1 << 62), ("spill", 0)):
            store = ObjectStore(budget_bytes=budget, store_dir=where, name=f"bench-{mode}")
            try:
                t, sizes = timed(lambda: [store.put(f"a/{i}", a) for i, a in enumerate(arrays)])
                rows.setdefault("put 4 MB arrays", []).append(sum(sizes) / t)
                t, got = timed(lambda: [float(store.get(f"a/{i}")[0]) for i in range(n_blocks)])
                rows.setdefault("get 4 MB arrays", []).append(sum(sizes) / t)
                t, size = timed(lambda: store.put_stream("r", records(n_records)))
                rows.setdefault("put_stream (str, int) records", []).append(size / t)
                t, count = timed(lambda: sum(1 for _ in store.iterate("r")))
                rows.setdefault("iterate the records", []).append(size / t)
                assert count == n_records and got == [float(i) for i in range(n_blocks)]
            finally:
                store.close()
    for what, (mem, spill) in rows.items():
        print(f"{what:<30} {mem / 1e9:>12.2f} {spill / 1e9:>12.2f}")
    print()


# --------------------------------------------------------------------------- 2. delete
def delete_cost(sizes: list[int]) -> None:
    print("2. delete(prefix) of one job's 100 keys (median of 5; store in memory)")
    print(f"{'keys stored':>11} {'delete us':>10} {'old dict scan us':>17}")
    for total in sizes:
        jobs = total // 100
        store = ObjectStore(budget_bytes=1 << 62, name="bench-delete")
        old: dict[str, bytes] = {}
        try:
            for j in range(jobs):
                for p in range(100):
                    key = f"job-{j}/stage-{p % 4}/part-{p}"
                    store.put(key, b"x")
                    old[key] = b"x"
            times, scans = [], []
            for rep in range(5):
                j = (rep * 7919) % jobs
                t0 = time.perf_counter()
                removed = store.delete(f"job-{j}/")
                times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                doomed = [k for k in old if k.startswith(f"job-{j}/")]
                for k in doomed:
                    del old[k]
                scans.append(time.perf_counter() - t0)
                assert removed == len(doomed) == 100
                for p in range(100):  # put the job back for the next repetition
                    key = f"job-{j}/stage-{p % 4}/part-{p}"
                    store.put(key, b"x")
                    old[key] = b"x"
        finally:
            store.close()
        print(f"{total:>11} {statistics.median(times) * 1e6:>10.0f} "
              f"{statistics.median(scans) * 1e6:>17.0f}")
    print()


# --------------------------------------------------------------------------- 3. cluster
class Run:
    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args

    def run(self, ctx: Any) -> Any:
        return self.fn(ctx, *self.args)


def put_arrays(ctx: Any, prefix: str, n: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    size = sum(ctx.put(f"{prefix}/{i}", np.full(BLOCK // 8, i, dtype=np.float64))
               for i in range(n))
    return {"s": time.perf_counter() - t0, "bytes": size, "stats": ctx.store.stats(),
            "hwm_mb": rss_mb("VmHWM"), "rss_mb": rss_mb()}


def fetch_arrays(ctx: Any, owner: Any, prefix: str, n: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    ok = all(float(ctx.fetch(owner, f"{prefix}/{i}", timeout_s=300)[-1]) == float(i)
             for i in range(n))
    return {"s": time.perf_counter() - t0, "ok": ok, "hwm_mb": rss_mb("VmHWM")}


def put_records(ctx: Any, n: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    size = ctx.put_stream("stream/r", records(n))
    return {"s": time.perf_counter() - t0, "bytes": size, "stats": ctx.store.stats(),
            "hwm_mb": rss_mb("VmHWM")}


def iter_records(ctx: Any, owner: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    count = sum(1 for _ in ctx.fetch_iter(owner, "stream/r", timeout_s=300))
    return {"s": time.perf_counter() - t0, "count": count, "hwm_mb": rss_mb("VmHWM")}


def rss_now(ctx: Any, field: str = "VmRSS") -> float:
    return rss_mb(field)


def cluster_run(budget_mb: int) -> None:
    budget = budget_mb * MB
    print(f"3. Local cluster, 2 workers, store_budget_bytes = {budget_mb} MB")
    in_memory = max(1, budget // (BLOCK + 4096) - 1)
    spilled = 4 * budget // BLOCK
    n_records = 4 * budget // 18  # ~18 pickled bytes per record
    with actorpy.connect(workers=2, store_budget_bytes=budget) as cluster:
        a, b = cluster.workers()
        base = cluster.submit_task(Run(rss_now), a).result(60)
        put_m = cluster.submit_task(Run(put_arrays, "mem", in_memory), a).result(600)
        put_s = cluster.submit_task(Run(put_arrays, "spill", spilled), a).result(600)
        put_r = cluster.submit_task(Run(put_records, n_records), a).result(600)
        # Fetched one after the other: the reader keeps what it fetched, so all at once
        # would measure the reader's memory, not the store's.
        get_m = cluster.submit_task(Run(fetch_arrays, a, "mem", in_memory), b).result(600)
        get_s = cluster.submit_task(Run(fetch_arrays, a, "spill", spilled), b).result(600)
        get_r = cluster.submit_task(Run(iter_records, a), b).result(600)
        served = cluster.submit_task(Run(rss_now, "VmHWM"), a).result(60)
    assert get_m["ok"] and get_s["ok"] and get_r["count"] == n_records
    print(f"{'what':<44} {'GB/s':>6} {'s':>7}")
    rows = [
        (f"put {in_memory} x 4 MB arrays (in memory)", put_m["bytes"], put_m["s"]),
        (f"put {spilled} x 4 MB arrays (spilled)", put_s["bytes"], put_s["s"]),
        (f"put_stream {n_records} (str, int) records", put_r["bytes"], put_r["s"]),
        ("fetch the in-memory arrays, other worker", put_m["bytes"], get_m["s"]),
        ("fetch the spilled arrays, other worker", put_s["bytes"], get_s["s"]),
        ("fetch_iter the records, other worker", put_r["bytes"], get_r["s"]),
    ]
    for what, size, secs in rows:
        print(f"{what:<44} {size / secs / 1e9:>6.2f} {secs:>7.2f}")
    print(f"records: put_stream {n_records / put_r['s'] / 1e6:.2f} M/s, "
          f"fetch_iter {n_records / get_r['s'] / 1e6:.2f} M/s")
    stored = (put_m["bytes"] + put_s["bytes"] + put_r["bytes"]) / MB
    st = put_r["stats"]
    print(f"worker A holds {stored:.0f} MB ({stored / budget_mb:.1f}x the budget): "
          f"{st.memory_bytes / MB:.0f} MB in memory, {st.spilled_bytes / MB:.0f} MB in "
          f"{st.spill_files} spill files")
    print(f"worker A peak RSS while storing: {put_r['hwm_mb']:.0f} MB ({base:.0f} MB at start; "
          f"+{put_r['hwm_mb'] - base:.0f} MB for a {budget_mb} MB budget)")
    print(f"worker A peak RSS after serving the fetches: {served:.0f} MB (mapped spill "
          "pages count while they are being sent)")
    print(f"worker B peak RSS (it keeps the arrays it fetched): {get_r['hwm_mb']:.0f} MB")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-mb", type=int, default=256, help="store budget per worker")
    parser.add_argument("--quick", action="store_true", help="small sizes (~1 min)")
    args = parser.parse_args(argv)
    budget_mb = 32 if args.quick else args.budget_mb
    print(f"actorpy object-store benchmark ({'quick' if args.quick else 'full'}; "
          f"{os.cpu_count()} cores)\n")
    local_throughput(64 if args.quick else 512)
    delete_cost([1_000, 10_000] if args.quick else [1_000, 10_000, 100_000])
    cluster_run(budget_mb)
    return 0


if __name__ == "__main__":
    sys.exit(main())

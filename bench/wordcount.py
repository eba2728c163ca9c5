"""Wordcount, whole processes side by side: actorpy against single-process Counter, a
hand-written multiprocessing.Pool(2), Dask bag and PySpark (when installed).

    python bench/wordcount.py                 # 200 MB corpus in 8 files (made once, reused)
    python bench/wordcount.py --size-mb 20    # a quick run
    python bench/wordcount.py --size-mb 2000  # worker memory stays bounded

The corpus is Zipf-like text generated deterministically (seeded) outside the repository,
under --corpus-dir (default: $TMPDIR/actorpy-bench). Every variant runs as its own process,
started and timed from here; the table gives seconds, MB/s, speed relative to (c), and the
CPU seconds (user + system) of the whole process tree, and the peak RSS of the driver process
and of each worker process (VmHWM, polled from /proc). Each variant's counts are checked
against (c)'s. On a shared machine the CPU seconds say what a variant costs even when the
load from other jobs makes its wall time meaningless (they count only processes that were
waited for: PySpark's JVM is not among them).

Variants:
  (a) `actorpy wordcount --workers 2 --json`  (apps/wordcount.py)
  (b) the same job in the fluent API: load -> flat_map(str.split) -> map(str.lower) ->
      filter -> map(lambda w: (w, 1)) -> reduce_by_key(operator.add) -> collect
  (c) one process: collections.Counter over map(str.split, map(str.lower, lines))
  (d) multiprocessing.Pool(2): one Counter per file, merged in the parent
  (e) Dask bag, idiomatic (read_text -> str.split -> flatten -> map(str.lower) -> filter ->
      frequencies), processes scheduler with 2 workers
  (f) PySpark local[2], idiomatic (textFile -> flatMap -> map -> filter -> reduceByKey)
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOP = sorted("a are is in it that this and to of so will can which for on an with the -".split())

# ----------------------------------------------------------------------------- corpus
SYLLABLES = ("ka ri to na mi su le po da ve shi ran tor mel bis qua zen fro ga hu lo ny "
             "pe sto ark ion est ur").split()


def _vocabulary(size: int, rng: np.random.Generator) -> list[str]:
    words: set[str] = set()
    out = list(STOP)  # the stop words are among the most frequent, as in real text
    words.update(out)
    while len(out) < size:
        n = int(rng.integers(1, 5))
        w = "".join(SYLLABLES[i] for i in rng.integers(0, len(SYLLABLES), n))
        if w not in words:
            words.add(w)
            out.append(w)
    return out


def make_corpus(directory: str, size_mb: int, files: int, seed: int = 0) -> list[str]:
    """Write (once) ``files`` text files of ``size_mb`` MB in all; returns their paths."""
    done = os.path.join(directory, "_COMPLETE")
    paths = [os.path.join(directory, f"text-{i:02d}.txt") for i in range(files)]
    if os.path.exists(done):
        return paths
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(200_000, rng)
    capital = np.array([w.capitalize() for w in vocab], dtype=object)
    lower = np.array(vocab, dtype=object)
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.05
    cum = np.cumsum(weights) / weights.sum()
    per_file = size_mb * 1_000_000 // files
    for i, path in enumerate(paths):
        frng = np.random.default_rng([seed, i])
        written = 0
        with open(path, "w", encoding="utf-8") as f:
            while written < per_file:
                n = 200_000
                idx = np.searchsorted(cum, frng.random(n))
                caps = frng.random(n) < 0.08
                words = np.where(caps, capital[idx], lower[idx]).tolist()
                cuts = np.cumsum(frng.integers(6, 18, n // 6)).tolist()
                lines, start = [], 0
                for end in cuts:
                    if end > n:
                        break
                    lines.append(" ".join(words[start:end]))
                    start = end
                text = "\n".join(lines) + "\n"
                f.write(text)
                written += len(text.encode())
    with open(done, "w"):
        pass
    return paths


# ----------------------------------------------------------------------------- variants
FLUENT = """
import json, operator, sys, actorpy
from engines import mapre
stop = frozenset(json.loads(sys.argv[2]))
with actorpy.connect(workers=2) as cluster:
    counts = (mapre.load(cluster, sys.argv[1])
              .flat_map(str.split)
              .map(str.lower)
              .filter(lambda w: w not in stop)
              .map(lambda w: (w, 1))
              .reduce_by_key(operator.add)
              .collect(timeout_s=3600, progress=False))
sys.stdout.write(json.dumps(dict(counts)))
"""

COUNTER = """
import glob, json, os, sys
from collections import Counter
from itertools import chain
stop = json.loads(sys.argv[2])
counts = Counter()
for path in sorted(glob.glob(os.path.join(sys.argv[1], "text-*.txt"))):
    with open(path, encoding="utf-8") as f:
        counts.update(chain.from_iterable(map(str.split, map(str.lower, f))))
for w in stop:
    counts.pop(w, None)
sys.stdout.write(json.dumps(counts))
"""

POOL = """
import glob, json, os, sys
from collections import Counter
from itertools import chain
from multiprocessing import Pool
stop = json.loads(sys.argv[2])

def count_file(path):
    with open(path, encoding="utf-8") as f:
        return Counter(chain.from_iterable(map(str.split, map(str.lower, f))))

if __name__ == "__main__":
    paths = sorted(glob.glob(os.path.join(sys.argv[1], "text-*.txt")))
    total = Counter()
    with Pool(2) as pool:
        for part in pool.imap_unordered(count_file, paths):
            total.update(part)
    for w in stop:
        total.pop(w, None)
    sys.stdout.write(json.dumps(total))
"""

DASK = """
import json, os, sys
import dask, dask.bag as db
stop = frozenset(json.loads(sys.argv[2]))
if __name__ == "__main__":
    with dask.config.set(scheduler="processes", num_workers=2):
        counts = (db.read_text(os.path.join(sys.argv[1], "text-*.txt"))
                  .map(str.split).flatten()
                  .map(str.lower)
                  .filter(lambda w: w not in stop)
                  .frequencies()
                  .compute())
    sys.stdout.write(json.dumps(dict(counts)))
"""

SPARK = """
import json, operator, os, sys
from pyspark import SparkContext
stop = frozenset(json.loads(sys.argv[2]))
sc = SparkContext("local[2]", "wordcount")
sc.setLogLevel("ERROR")
counts = (sc.textFile(os.path.join(sys.argv[1], "text-*.txt"))
          .flatMap(str.split)
          .map(str.lower)
          .filter(lambda w: w not in stop)
          .map(lambda w: (w, 1))
          .reduceByKey(operator.add)
          .collect())
sc.stop()
sys.stdout.write(json.dumps(dict(counts)))
"""


def compile_checkout() -> str:
    """Byte-compile the checkout's packages, as ``pip install`` does, so that (a) and (b)
    start as an installed actorpy starts (~60 ms less on this machine): an interpreter with
    ``PYTHONDONTWRITEBYTECODE`` set never writes the ``.pyc`` files of an editable install,
    and would compile every module from source at every start. The standard library the
    other variants import is compiled already. Returns what was compiled ("" if nothing)."""
    dirs = [d for d in ("actorpy", "engines", "apps") if os.path.isdir(os.path.join(ROOT, d))]
    for d in dirs:
        compileall.compile_dir(os.path.join(ROOT, d), quiet=2)
    return ", ".join(dirs)


def _have(module: str) -> bool:
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True)
    return probe.returncode == 0


def variants(corpus: str) -> list[tuple[str, list[str] | None, str]]:
    """(label, command or None when unavailable, reason when unavailable)."""
    stop = json.dumps(STOP)
    py = sys.executable
    out: list[tuple[str, list[str] | None, str]] = [
        ("(a) actorpy wordcount", [py, "-m", "actorpy", "wordcount", "--workers", "2", "--json",
                                   corpus], ""),
        ("(b) actorpy fluent", [py, "-c", FLUENT, corpus, stop], ""),
        ("(c) Counter, 1 process", [py, "-c", COUNTER, corpus, stop], ""),
        ("(d) multiprocessing.Pool(2)", [py, "-c", POOL, corpus, stop], ""),
    ]
    out.append(("(e) Dask bag, 2 processes", [py, "-c", DASK, corpus, stop], "")
               if _have("dask.bag") else
               ("(e) Dask bag, 2 processes", None, "not installed (pip install 'dask[bag]')"))
    if not _have("pyspark"):
        out.append(("(f) PySpark local[2]", None, "not installed (pip install pyspark)"))
    elif shutil.which("java") is None:
        out.append(("(f) PySpark local[2]", None, "no Java runtime on PATH"))
    else:
        out.append(("(f) PySpark local[2]", [py, "-c", SPARK, corpus, stop], ""))
    return out


# ----------------------------------------------------------------------------- measuring
def _tree(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        p = stack.pop()
        found.append(p)
        for tid in os.listdir(f"/proc/{p}/task") if os.path.isdir(f"/proc/{p}/task") else []:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    return found


def _hwm_mb(pid: int) -> tuple[float, str] | None:
    """(VmHWM in MB, the command line and the name, ``comm``: a cluster process forked by
    the driver keeps the driver's command line, and is named ``actorpy-manager``...)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        with open(f"/proc/{pid}/comm") as f:
            cmd += f" [{f.read().strip()}]"
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024, cmd
    return None


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(cmd: list[str], out_path: str,
        timeout_s: float) -> tuple[float, float, float, list[float], int]:
    """Run ``cmd`` (stdout to ``out_path``); returns (seconds, CPU seconds of the whole
    process tree, driver MB, worker MBs, rc)."""
    peaks: dict[int, tuple[float, str]] = {}
    cpu0 = _children_cpu_s()
    env = {**os.environ, "PYTHONPATH": ROOT, "ACTORPY_PROGRESS": "0"}
    with open(out_path, "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env=env)
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                for pid in _tree(proc.pid):
                    got = _hwm_mb(pid)
                    if got and got[0] >= peaks.get(pid, (0.0, ""))[0]:
                        peaks[pid] = got
                stop.wait(0.05)
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        seconds = time.perf_counter() - t0
        cpu = _children_cpu_s() - cpu0  # every process of the tree was waited for by its parent
        stop.set()
        poller.join()
    if proc.returncode != 0:
        sys.stderr.write(err.decode(errors="replace")[-2000:])
    driver = peaks.get(proc.pid, (0.0, ""))[0]
    # workers: every other process of the tree but the manager and helpers under 5 MB
    workers = [mb for pid, (mb, cmd) in peaks.items()
               if pid != proc.pid and "actorpy manager" not in cmd
               and "[actorpy-manager]" not in cmd and mb >= 5]
    return seconds, cpu, driver, sorted(workers, reverse=True), proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--corpus-dir", default=os.path.join(tempfile.gettempdir(),
                                                             "actorpy-bench"))
    parser.add_argument("--only", default="", help="comma-separated variant letters, e.g. a,c")
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds over all variants; each reports its best time (with "
                             "that run's CPU seconds)")
    args = parser.parse_args(argv)
    corpus = os.path.join(args.corpus_dir, f"zipf-{args.size_mb}mb-{args.files}files")
    t0 = time.perf_counter()
    paths = make_corpus(corpus, args.size_mb, args.files)
    size_mb = sum(os.path.getsize(p) for p in paths) / 1e6
    print(f"corpus: {corpus} ({size_mb:.0f} MB in {len(paths)} files; "
          f"ready in {time.perf_counter() - t0:.1f} s)")
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
          f"load average {os.getloadavg()[0]:.2f}, best of {args.repeat}")
    compiled = compile_checkout()
    if compiled:
        print(f"compiled {compiled} (an installed package has its bytecode; with "
              "PYTHONDONTWRITEBYTECODE set, a checkout would recompile it every run)")
    chosen = [(label, cmd, why) for label, cmd, why in variants(corpus)
              if not args.only or label[1] in args.only.split(",")]
    best: dict[str, tuple[float, float, float, list[float]]] = {}
    failed: dict[str, str] = {}
    counts_of: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # rounds alternate the variants, so a burst of load on a shared machine does not
        # land on one of them only; each keeps its best time (and its highest memory)
        for _ in range(args.repeat):
            for label, cmd, why in chosen:
                letter = label[1]
                if cmd is None or letter in failed:
                    continue
                out_path = os.path.join(tmp, f"{letter}.json")
                seconds, cpu, driver, workers, rc = run(cmd, out_path, args.timeout_s)
                if rc != 0:
                    failed[letter] = f"failed (exit {rc}), see stderr above"
                    continue
                if letter not in counts_of:
                    with open(out_path) as f:
                        counts_of[letter] = json.load(f)
                old = best.get(letter)
                if old is None:
                    best[letter] = (seconds, cpu, driver, workers)
                else:
                    best[letter] = ((seconds, cpu) if seconds < old[0] else old[:2]) + (
                        max(old[2], driver),
                        workers if max(workers, default=0) > max(old[3], default=0) else old[3])
    reference = counts_of.get("c")
    results = {k: v[0] for k, v in best.items()}
    rows: list[tuple[str, Any, Any]] = []
    for label, cmd, why in chosen:
        letter = label[1]
        if cmd is None:
            rows.append((label, None, why))
        elif letter in failed:
            rows.append((label, None, failed[letter]))
        else:
            rows.append((label, best[letter], counts_of[letter]))
    base = results.get("c")
    print(f"\n{'variant':<30} {'seconds':>8} {'MB/s':>7} {'vs (c)':>7} {'CPU s':>6} "
          f"{'driver MB':>10}  {'worker MB (each)':<20} check")
    for label, measured, extra in rows:
        if measured is None:
            print(f"{label:<30} {'-':>8} {'-':>7} {'-':>7} {'-':>6} {'-':>10}  {'-':<20} "
                  f"skipped: {extra}")
            continue
        seconds, cpu, driver, workers = measured
        ratio = f"{base / seconds:.2f}x" if base else "-"
        check = "-" if reference is None else ("same counts" if extra == reference else
                                               "DIFFERENT COUNTS")
        each = "/".join(f"{w:.0f}" for w in workers[:4]) or "-"
        if len(workers) > 4:
            each += f" +{len(workers) - 4}"
        print(f"{label:<30} {seconds:>8.2f} {size_mb / seconds:>7.1f} {ratio:>7} {cpu:>6.1f} "
              f"{driver:>10.0f}  {each:<20} {check}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

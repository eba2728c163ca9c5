"""Services and streams: what the runtime adds over the raw request path, in one run.

Rows (medians over ``--repeat`` rounds, embedded cluster with 2 workers):
- ``task round trip``: ``submit_to(w, f).result()`` of a trivial function (the baseline:
  a request answered from the task pool).
- ``service call``: ``cluster.call(ref, kind, x)`` to a ``Service`` with ``@handles`` (the
  I/O thread routes to the service's inbox, its thread decodes, dispatches and replies).
- ``service<->service``: a ping-pong of ``ctx.request(..., on_reply=)`` between services on
  the two workers, per round trip (the engines' path: no driver involved); then between
  two services on one worker (the node's loopback, no socket).
- ``stream items``: small items emitted by a task and iterated by the driver, per item,
  against one ``submit`` round trip per item.
- ``stream MB/s``: 1 MB items through a stream, window 8 items.

Run: ``.venv/bin/python bench/services.py [--n 2000] [--repeat 3]``
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

import actorpy
from actorpy.runtime.service import Envelope, Service, ServiceContext, handles
from actorpy.runtime.tasks import ContextCallTask

ECHO, START, PING = 1, 2, 3


class Echo(Service):
    @handles(ECHO)
    def echo(self, value: Any, env: Envelope) -> Any:
        return value


class Pinger(Service):
    """PING(ref, n) plays n request/reply rounds with ``ref`` and answers when done."""

    @handles(PING)
    def ping(self, args: tuple[Any, int], env: Envelope) -> None:
        peer, n = args
        reply = env.defer()
        t0 = time.perf_counter()

        def again(fut: Any, left: int) -> None:
            fut.result()
            if left == 0:
                reply.send(time.perf_counter() - t0)
                return
            self.ctx.request(peer, ECHO, left, timeout_s=30,
                             on_reply=lambda f: again(f, left - 1))
        self.ctx.request(peer, ECHO, n, timeout_s=30, on_reply=lambda f: again(f, n - 1))

    @handles(ECHO)
    def echo(self, value: Any, env: Envelope) -> Any:
        return value


def emit_n(ctx: ServiceContext, n: int, size: int) -> int:
    item = np.zeros(size // 8) if size else 0
    for _ in range(n):
        ctx.emit(item)
    return n


def _time(fn: Any, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=2000, help="round trips / items per row")
    p.add_argument("--mb", type=int, default=200, help="MB streamed in the MB/s row")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    n = args.n
    with actorpy.connect(workers=2) as cluster:
        w0, w1 = cluster.workers()
        echo = cluster.start_service(Echo, node=w0)
        a, b = cluster.start_service(Pinger, node=w0), cluster.start_service(Pinger, node=w1)
        rows: list[tuple[str, float, str]] = []
        task = _time(lambda: [cluster.submit_to(w0, abs, i).result(30) for i in range(n)],
                     args.repeat) / n
        rows.append(("task round trip", task * 1e6, "us"))
        call = _time(lambda: [cluster.call(echo, ECHO, i, timeout_s=30) for i in range(n)],
                     args.repeat) / n
        rows.append(("service call", call * 1e6, "us"))
        pp = statistics.median(cluster.call(a, PING, (b, n), timeout_s=120) / n
                               for _ in range(args.repeat))
        rows.append(("service<->service request", pp * 1e6, "us"))
        c = cluster.start_service(Pinger, node=w0)
        same = statistics.median(cluster.call(a, PING, (c, n), timeout_s=120) / n
                                 for _ in range(args.repeat))
        rows.append(("  same node (loopback)", same * 1e6, "us"))

        def stream_small() -> None:
            with cluster.submit_stream_task(ContextCallTask(emit_n, (n, 0)), w0) as s:
                assert sum(1 for _ in s) == n
        rows.append(("stream item (small)", _time(stream_small, args.repeat) / n * 1e6, "us"))
        items = args.mb

        def stream_big() -> None:
            with cluster.submit_stream_task(ContextCallTask(emit_n, (items, 1 << 20)), w0,
                                            window_items=8) as s:
                assert sum(x.nbytes for x in s) == items * (1 << 20)
        big = _time(stream_big, args.repeat)
        rows.append(("stream 1 MB items", items / big, "MB/s"))
    print(f"{'row':<28} {'value':>10}  unit")
    for name, value, unit in rows:
        print(f"{name:<28} {value:>10.1f}  {unit}")
    print(f"{'service call / task':<28} {call / task:>10.2f}  ratio")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Run functions on an embedded local cluster: results, arrays, errors, timeouts.

    python examples/remote_tasks.py
"""
import numpy as np

import actorpy


def slow_square(x: int) -> int:
    return x * x


def main() -> None:
    with actorpy.connect(workers=2) as cluster:          # manager + 2 worker processes
        print("workers:", cluster.workers())
        print("squares:", cluster.map(slow_square, range(8), timeout_s=30))

        a = np.arange(1_000_000, dtype=np.float64)       # 8 MB travels without pickling copies
        print("sum on a worker:", cluster.submit(np.sum, a).result(timeout=30))

        try:
            cluster.submit(int, "not a number").result(timeout=30)
        except actorpy.RemoteError as err:               # remote type, message, node, traceback
            print(f"remote {err.remote_type} on {err.node_id}: {err.remote_message}")

        future = cluster.submit(lambda: __import__("time").sleep(1) or "late")
        try:
            future.result(timeout=0.1)
        except TimeoutError:                              # ActorpyTimeout is a TimeoutError
            print("not done after 0.1 s; waiting longer:", future.result(timeout=30))


if __name__ == "__main__":
    main()

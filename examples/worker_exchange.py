"""Workers hand data to each other directly (the way a shuffle or a PS exchange works):
one task keeps a block in its worker's object store, a task on another worker fetches it.
The block never passes through the driver or the manager.

    python examples/worker_exchange.py
"""
import numpy as np

import actorpy


class Produce:
    """A task object: anything with run(ctx) can be sent with submit_task."""

    def __init__(self, key: str, n: int) -> None:
        self.key, self.n = key, n

    def run(self, ctx):
        return ctx.put(self.key, np.arange(self.n, dtype=np.float32))   # bytes kept


class Consume:
    def __init__(self, owner, key: str) -> None:
        self.owner, self.key = owner, key

    def run(self, ctx):
        block = ctx.fetch(self.owner, self.key, timeout_s=30)            # worker to worker
        return float(block.sum()), str(ctx.node_id)


def main() -> None:
    with actorpy.connect(workers=2) as cluster:
        a, b = cluster.workers()
        kept = cluster.submit_task(Produce("block-0", 4_000_000), a).result(timeout=30)
        total, where = cluster.submit_task(Consume(a, "block-0"), b).result(timeout=30)
        print(f"{kept / 1e6:.0f} MB kept on {a}, summed on {where}: {total:.0f}")
        print(f"bytes the driver received meanwhile: {cluster.node.bytes_in}")


if __name__ == "__main__":
    main()

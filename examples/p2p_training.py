"""A P2P job: linear regression by SGD with no server. Four peers on the embedded cluster's
workers hold the model on a Kademlia overlay (each key on its closest peers), each peer
trains on data it makes itself, and the key's owner folds the updates in; a PSP barrier
samples one peer through the overlay at each step.

    python examples/p2p_training.py
"""
import numpy as np

import actorpy
from actorpy.barrier import PSP
from engines import peer

W_TRUE = np.arange(1.0, 9.0)       # the weights to find


def make_data(index):              # runs on each peer: its own rows
    rng = np.random.default_rng(index)
    x = rng.standard_normal((2000, 8))
    return x, x @ W_TRUE + 0.01 * rng.standard_normal(2000)


job = peer.Job("linreg", barrier=PSP(sample=1, staleness=2), seed=7, batch=32)
job.register_schedule(lambda ctx: ["w"])      # the keys this peer works on this step


@job.register_push                 # every peer: the values it read -> its updates
def push(ctx, values):
    x, y = ctx.data
    i = ctx.rng.integers(0, len(y), ctx.batch_size)
    return {"w": x[i].T @ (x[i] @ values["w"] - y[i]) / len(i)}


@job.register_pull                 # the key's owner: fold one peer's update in
def pull(store, updates):
    w, _clock = store.get("w")
    store.set("w", w - 0.05 * updates["w"])


job.register_stop(lambda ctx: ctx.step >= 100)   # each peer decides for itself


def main() -> None:
    with actorpy.connect(workers=2) as cluster:
        result = job.run(cluster, peers=4, init={"w": np.zeros(8)}, data=make_data,
                         timeout_s=60)
        print("w =", np.round(result.model["w"], 3))
        print(f"steps per peer {sorted(result.steps.values())}, {result.updates} updates "
              f"in {result.seconds:.2f} s")


if __name__ == "__main__":
    main()

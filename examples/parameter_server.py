"""A parameter-server job: linear regression by SGD, each worker training on data it makes
itself, the server folding the gradients into the model under an SSP barrier.

    python examples/parameter_server.py
"""
import numpy as np

import actorpy
from actorpy.barrier import SSP
from engines import param

W_TRUE = np.arange(1.0, 9.0)       # the weights to find


def make_data(ctx):                # runs once on each worker: its own rows
    x = ctx.rng.standard_normal((2000, 8))
    return x, x @ W_TRUE + 0.01 * ctx.rng.standard_normal(2000)


job = param.Job("linreg", barrier=SSP(staleness=2), seed=7, data=make_data)


@job.register_push                 # worker: the values it was sent -> its update
def push(ctx, values):
    x, y = ctx.data
    i = ctx.rng.integers(0, len(y), ctx.batch_size)
    return {"w": x[i].T @ (x[i] @ values["w"] - y[i]) / len(i)}


@job.register_pull                 # server: fold the (averaged) updates into the model
def pull(store, updates):
    w, _clock = store.get("w")
    store.set("w", w - 0.1 * updates["w"])


@job.register_stop                 # server: checked after every pull
def stop(store):
    return np.abs(store.get("w")[0] - W_TRUE).max() < 0.01


def main() -> None:
    with actorpy.connect(workers=2) as cluster:
        run = job.start(cluster, init={"w": np.zeros(8)}, batch=32, timeout_s=60)
        w = run.result()["w"]
        print("w =", np.round(w, 3))
        print(f"steps per worker {run.stats.steps_per_worker}, {run.stats.updates} updates "
              f"in {run.stats.seconds:.2f} s")


if __name__ == "__main__":
    main()

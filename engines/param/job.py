"""``param.Job``: Actor's parameter-server callbacks, registered on an explicit job object.

    job = param.Job("linreg", barrier=SSP(staleness=4), seed=7, data=make_shard)

    @job.register_push                        # worker: values of the scheduled keys -> updates
    def push(ctx, values):
        x, y = ctx.data
        i = ctx.rng.integers(0, len(y), ctx.batch_size)
        return {"w": grad(values["w"], x[i], y[i])}

    @job.register_pull                        # server: fold the (aggregated) updates in
    def pull(store, updates):
        w, _clock = store.get("w")
        store.set("w", w - 0.01 * updates["w"])

    job.register_stop(lambda store: store.step >= 1000)
    model = job.run(cluster, init={"w": np.zeros(16)}, timeout_s=600)

Every ``register_*`` returns its function, so each also works as a decorator.
"""
from __future__ import annotations

import numbers
from collections import abc
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar

from actorpy.barrier import ASP, BSP, DSSP, PSP, SSP, Decision
from actorpy.errors import ConfigError
from actorpy.ids import NodeId
from actorpy.values import as_decision, describe
from engines.param.server import AGGREGATES
from engines.param.store import Store
from engines.param.worker import DataContext, WorkerContext

F = TypeVar("F", bound=Callable[..., Any])
#: The longest job name: it names the job's services ("NAME/shard12", "NAME/conductor"),
#: which the cluster keeps to 200 characters. A longer one was refused by the first shard's
#: registration, after the run had started (a RemoteError repeating the whole name).
MAX_NAME_CHARS = 150

Schedule = Callable[[Store, list[NodeId]], Mapping[NodeId, Sequence[str]]]
PushFn = Callable[[WorkerContext, dict[str, Any]], dict[str, Any]]
PullFn = Callable[[Store, dict[str, Any]], None]
StopFn = Callable[[Store], bool]
BarrierFn = Callable[[int, Any], "bool | Decision"]


def _function(role: str, fn: Any) -> None:
    """Refuse a callback that cannot be called: it was taken, and every worker or shard
    failed on it later with "'int' object is not callable" (a RemoteError)."""
    if not callable(fn):
        raise ConfigError(f"{role} must be a function, got {describe(fn)}")


def _nodes(option: str, nodes: Any) -> tuple[NodeId, ...] | None:
    """``workers=`` or ``server_nodes=`` as a tuple: refused when it is a single id (a str was
    taken as the list of its characters, each "not a live worker") or names a node twice
    (said to be "not all live workers", though each was)."""
    if nodes is None:
        return None
    if isinstance(nodes, (str, bytes)) or not isinstance(nodes, abc.Iterable):
        raise ConfigError(f"{option}= must be a list of worker ids, got {describe(nodes)}: "
                          f"{nodes!r}; for one worker, pass [{nodes!r}]")
    nodes = tuple(nodes)
    twice = next((n for i, n in enumerate(nodes) if n in nodes[:i]), None)
    if twice is not None:
        raise ConfigError(f"{option}={list(nodes)} names {twice!r} more than once; name each "
                          "worker once")
    return nodes


@dataclass(frozen=True)
class FunctionBarrier:
    """A barrier function ``fn(me_step, view) -> bool | Decision`` as a policy; ``view``
    is the server's table of the other workers (``steps()``, ``sample(n)``)."""

    fn: BarrierFn

    def decide(self, me_step: int, view: Any) -> Decision:
        return as_decision(self.fn(me_step, view))



def balances(barrier: Any) -> bool:
    """Whether ``balance=True`` may run under ``barrier``: a policy that holds a fast worker
    for a slow one (BSP: LB-BSP; SSP, PSP, DSSP: the same batch sizes keep the workers' steps
    in pace, so the bound rarely holds anyone). Not ASP, where nobody waits, nor a custom
    policy."""
    return isinstance(barrier, (SSP, PSP, DSSP))


def overlaps(barrier: Any, schedule: Any) -> bool:
    """Whether ``overlap=True`` lets a worker compute its next step while its push travels
    under ``barrier``: a policy with a staleness of 1 or more (ASP, SSP(s), PSP(β, s),
    DSSP(low, high) with low >= 1), whose bound the step computed ahead keeps (it reads
    values missing only the worker's own last update), and the default schedule (with
    ``register_schedule`` the step ahead would work on the keys named for the step before).

    >>> [overlaps(p, None) for p in (ASP(), SSP(1), PSP(2, 1), DSSP(1, 4), BSP(), SSP(0))]
    [True, True, True, True, False, False]
    """
    if schedule is not None:
        return False
    if isinstance(barrier, ASP):
        return True
    if isinstance(barrier, (SSP, PSP)):
        return barrier.staleness >= 1
    return isinstance(barrier, DSSP) and barrier.low >= 1


class Job:
    """A parameter-server job: callbacks plus the barrier, the seed and per-worker data.

    Args:
        name: names the job in logs and checkpoints (a resumed job must keep its name).
        barrier: ``BSP()``, ``SSP(s)``, ``ASP()``, ``PSP(sample, staleness)``,
            ``DSSP(low, high)``, or any object with ``decide(me_step, view)``.
        seed: seeds every worker's rng (per data slot) and the server's PSP samples.
        data: ``data(ctx: DataContext) -> Any`` runs once on each worker; its result is
            ``ctx.data`` in ``push`` (data is made or loaded where it is used).
        aggregate: how a release folds the buffered updates: ``"mean"`` (one ``pull`` with
            each key's batch-size-weighted mean: every sample counts equally; under BSP one
            pull per round; under ASP, SSP(s > 0), PSP and DSSP, which have no rounds, each
            update is its own step, one ``pull`` each), ``"sum"``, or ``"each"`` (one
            ``pull`` per worker update). Integer and bool keys need ``"sum"`` or ``"each"``
            (``run`` refuses them under ``"mean"``).
    """

    def __init__(self, name: str, barrier: Any = None, seed: int = 0, *,
                 data: Callable[[DataContext], Any] | None = None,
                 aggregate: str = "mean") -> None:
        if not name or not isinstance(name, str):
            raise ConfigError("a job needs a non-empty name")
        if len(name) > MAX_NAME_CHARS:
            raise ConfigError(f"a job name has at most {MAX_NAME_CHARS} characters (it names "
                              f"the job's services), not {len(name):,}: {name[:40]!r}...")
        barrier = BSP() if barrier is None else barrier
        if isinstance(barrier, type) or not callable(getattr(barrier, "decide", None)):
            # (a class, BSP for BSP(), has a decide too: it failed in the shard)
            raise ConfigError(f"barrier must be BSP(), SSP(s), ASP(), PSP(b, s), DSSP(lo, hi) "
                              f"or have decide(me_step, view); got {barrier!r}")
        if not isinstance(seed, numbers.Integral) or seed < 0:   # as numpy's seeds are
            raise ConfigError(f"seed must be an int >= 0, got {seed!r}")
        if data is not None:
            _function("data", data)
        if aggregate not in AGGREGATES:
            raise ConfigError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        self.name = name
        self.barrier = barrier
        self.seed = seed
        self.data = data
        self.aggregate = aggregate
        self.schedule: Schedule | None = None
        self.push: PushFn | None = None
        self.pull: PullFn | None = None
        self.stop: StopFn | None = None

    # ----------------------------------------------------------------- registry
    def register_schedule(self, fn: F) -> F:
        """Server: ``fn(store, workers) -> {worker: [keys]}``, called when workers are let
        go; each gets the values of its keys. Default: every key to every worker."""
        _function("register_schedule", fn)
        self.schedule = fn
        return fn

    def register_push(self, fn: F) -> F:
        """Worker: ``fn(ctx: WorkerContext, values) -> {key: update}`` (same type, shape
        and dtype as the values); ``{}``: no update this step. None (a missing ``return``)
        fails the job."""
        _function("register_push", fn)
        self.push = fn
        return fn

    def register_pull(self, fn: F) -> F:
        """Server: ``fn(store, updates)`` folds (aggregated) updates into the model with
        ``store.get(key) -> (value, clock)`` and ``store.set(key, value)``; build new
        values, never change stored ones in place (they are on their way to workers)."""
        _function("register_pull", fn)
        self.pull = fn
        return fn

    def register_barrier(self, fn: F) -> F:
        """Server: a custom barrier ``fn(me_step, view) -> bool | Decision`` replacing the
        job's policy (``view.steps()``: the other workers' completed steps)."""
        _function("register_barrier", fn)
        self.barrier = FunctionBarrier(fn)
        return fn

    def register_stop(self, fn: F) -> F:
        """Server: ``fn(store) -> bool``, checked after each pull (and after a step whose
        push returned ``{}``, which runs no pull, and once before a resumed job's first
        step); True ends the job. With
        several shards each shard checks it, and a shard that does not hold a key the
        function reads does not vote."""
        _function("register_stop", fn)
        self.stop = fn
        return fn

    # ----------------------------------------------------------------- running
    def start(self, cluster: Any, init: Mapping[str, Any], *, servers: int = 1,
              timeout_s: float = 600.0, checkpoint_dir: str | None = None,
              checkpoint_every: int = 0, resume: bool = False, balance: bool = False,
              batch: int = 32, straggler_factor: float | None = None,
              straggler_patience: int = 100, workers: Sequence[NodeId] | None = None,
              server_nodes: Sequence[NodeId] | None = None, overlap: bool = True) -> Any:
        """Start the job and return its :class:`~engines.param.driver.Run` at once (see
        :meth:`run` for the arguments); ``Run.result(timeout_s)`` gives the model."""
        from engines.param.driver import Run, RunOptions

        if self.push is None or self.pull is None:
            raise ConfigError(f"job {self.name!r} needs register_push and register_pull")
        if self.stop is None:
            raise ConfigError(f"job {self.name!r} needs a stop condition: "
                              "job.register_stop(lambda store: store.step >= 100)")
        if balance and not balances(self.barrier):
            raise ConfigError("balance=True resizes batches so that the workers' steps keep "
                              "pace; it needs a barrier that holds fast workers for slow ones "
                              f"(BSP, SSP, PSP or DSSP), not {self.barrier!r}")
        options = RunOptions(servers=servers, timeout_s=timeout_s, checkpoint_dir=checkpoint_dir,
                             checkpoint_every=checkpoint_every, resume=resume, balance=balance,
                             batch=batch, straggler_factor=straggler_factor,
                             straggler_patience=straggler_patience,
                             workers=_nodes("workers", workers),
                             server_nodes=_nodes("server_nodes", server_nodes),
                             overlap=bool(overlap) and overlaps(self.barrier, self.schedule))
        return Run(self, cluster, init, options).start()

    def run(self, cluster: Any, init: Mapping[str, Any], *, servers: int = 1,
            timeout_s: float = 600.0, checkpoint_dir: str | None = None,
            checkpoint_every: int = 0, resume: bool = False, balance: bool = False,
            batch: int = 32, straggler_factor: float | None = None,
            straggler_patience: int = 100,
            workers: Sequence[NodeId] | None = None,
            server_nodes: Sequence[NodeId] | None = None,
            overlap: bool = True) -> dict[str, Any]:
        """Train on ``cluster`` until the stop condition holds; returns the final model.

        Args:
            cluster: a connected ``actorpy.Cluster`` (its workers run ``push``; server
                shards live on workers too, see ``server_nodes``).
            init: key -> initial value (numpy arrays or torch tensors).
            servers: server shards; keys are spread over them by a stable hash.
            timeout_s: the whole job's time limit.
            checkpoint_dir: where shards save model and clocks (atomically); a lost shard
                is restarted from it on another worker. A shard that cannot write there
                refuses to start (``ConfigError``), resumed or not.
            checkpoint_every: pulls between checkpoints (0: only at start and end).
            resume: start from the checkpoint in ``checkpoint_dir`` (refused if missing,
                corrupt or foreign).
            balance: resize each worker's batch (``ctx.batch_size``) from its measured
                compute times so that all take as long per step, keeping ``batch`` x
                workers samples in all. Under BSP (LB-BSP) at every barrier, a round's
                updates weighted by batch; under SSP, PSP and DSSP once every worker has
                pushed since the last resize, each update folded alone as without it.
            batch: each worker's batch size (``ctx.batch_size``); with ``balance``, the
                mean batch.
            straggler_factor: release a worker whose time per sample stays above this
                many times the others' median (a finite number > 1; None, the default: no
                release) for ``straggler_patience`` steps in a row
                (default 100: on a loaded machine a handful of slow steps in a row happen
                to a healthy worker, and a patience of 5 released one in bench runs).
            workers: the workers to use (default: all, and any that join later).
            server_nodes: workers that host the server shards and do not train (shard
                ``i`` on ``server_nodes[i % len]``), as a PS with server processes of its
                own; by default shard ``i`` lives on the ``i``-th training worker, which
                then shares its process with it. A lost one is replaced like any shard host.
            overlap: under a barrier with a staleness (ASP, SSP(s), PSP(β, s) with s >= 1,
                DSSP with low >= 1) and the default schedule, a worker computes its next step
                while its push travels, on the values its last reply carried (missing only
                its own last update, as ps-lite's bounded delay), and the server releases it
                once it may begin the step after (so no worker begins one more than the
                staleness ahead). A step then costs about the longer of its compute and
                its round trip, not both. False: each step waits for its reply.

        Raises:
            RemoteError: a callback raised (remote type, message, traceback, node id).
            JobFailed, ActorpyTimeout: no stop within ``timeout_s``, all workers lost, a
                server shard lost without a checkpoint.

        Example::

            model = job.run(cluster, init={"w": np.zeros(16)}, timeout_s=60)
        """
        run = self.start(cluster, init, servers=servers, timeout_s=timeout_s,
                         checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                         resume=resume, balance=balance, batch=batch,
                         straggler_factor=straggler_factor,
                         straggler_patience=straggler_patience, workers=workers,
                         server_nodes=server_nodes, overlap=overlap)
        try:
            return run.result()
        except BaseException:
            # Ctrl-C (a notebook's interrupt) or any error: the job must not go on without
            # its driver (Run.result does the same for an interrupt while it waits)
            run.cancel_and_wait()
            raise

    def __repr__(self) -> str:
        return f"<param.Job {self.name!r} barrier={self.barrier!r} seed={self.seed}>"


__all__ = ["Job", "FunctionBarrier", "ASP", "BSP", "DSSP", "PSP", "SSP"]

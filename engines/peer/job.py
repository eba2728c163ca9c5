"""``peer.Job``: a training job on the overlay, with the PS engine's vocabulary and no server.

    job = peer.Job("linreg", barrier=PSP(sample=4, staleness=2), replication=3, seed=7)

    @job.register_schedule                     # which keys this peer works on this step
    def schedule(ctx: peer.PeerContext) -> list[str]:
        return ["w"]

    @job.register_push                         # compute updates from the keys' values
    def push(ctx, values):
        x, y = ctx.data
        rows = ctx.rng.integers(0, len(y), 32)
        return {"w": gradient(values["w"], x[rows], y[rows])}

    @job.register_pull                         # on the key's owner: fold an update in
    def pull(store: peer.OwnerStore, updates):
        w, _clock = store.get("w")
        store.set("w", w - 0.05 * updates["w"])

    job.register_stop(lambda ctx: ctx.step >= 200)
    result = job.simulate(peers=8, init={"w": np.zeros(16)})   # in-process, virtual time

Each key lives on its ``replication`` closest peers; the closest one (its *owner*) runs
``pull`` for it. Values handed to ``push`` are read-only arrays (tensors: the peer's own
copies), as are those ``pull`` reads with ``store.get``. The barrier is any shared
policy: PSP samples β peers through the overlay, BSP/SSP read every peer's step, ASP none.
``simulate`` runs the peers in this process on ``SimNetwork`` (seeded latency, failures,
joins); the shell that runs them on a cluster's workers over the real wire is separate.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, Iterable, Mapping, TypeVar

from actorpy.barrier import ASP, Policy
from actorpy.errors import ConfigError
from actorpy.values import describe, is_int

from .context import JobSpec, Pull, Push, Schedule, Stop
from .kademlia.events import KademliaConfig
from .kademlia.values import unstorable
from .pipeline import MAX_BATCH

#: the deepest pipeline a job may ask for (``Job(overlap=...)``): a batch of pushes is the
#: steps computed while one travels, and a PUSH carries ``MAX_BATCH`` steps at most
MAX_OVERLAP = MAX_BATCH - 1
#: The longest job name: its peers' service names ("peer/NAME/ID/INDEX") hold it, and the
#: cluster keeps those to 200 characters (a longer one failed once the run had started).
MAX_NAME_CHARS = 150

F = TypeVar("F", bound=Callable[..., Any])


def _function(role: str, fn: Any) -> None:
    """Refuse a callback that cannot be called: it was taken, and every peer failed on it
    later with "'int' object is not callable"."""
    if not callable(fn):
        raise ConfigError(f"{role} must be a function, got {describe(fn)}")

#: Overlay settings for training (virtual or real seconds): a request waits 0.5 s for its
#: answer (PINGs and FIND_NODEs less: the contact's measured round trip), replica checks
#: notice a dead holder within about a second, an owner reuses its replicas for 10 s instead
#: of looking them up at every write. Before, 0.1 s: on a loaded host live peers missed it,
#: were evicted and their keys changed owners (100 keys of 4 peers: 43-84 s a 5-step job and
#: 7-10 keys short of an acknowledged push, where 0.5 s gives 1.5 s and every push).
TRAINING_OVERLAY = dict(rpc_timeout_s=0.5, replica_check_s=0.5, holders_cache_s=10.0,
                        refresh_on_join=False, dead_for_s=60.0)


class Job:
    """A P2P job (see the module docstring).

    Args:
        name: the job's name (logs).
        barrier: BSP(), SSP(s), ASP(), PSP(sample, staleness), DSSP(low, high) or any Policy.
        replication: how many of a key's closest peers hold it (its owner and replicas).
        seed: seeds every peer's rngs (each with its own index).
        ksize: Kademlia's k (bucket size, lookup width).
        alpha: Kademlia's α (requests in flight per lookup).
        poll_s: how long a blocked peer waits before checking its barrier again.
        replicate_s: how long a key owner's own writes may wait for a round to the key's
            other holders (an answer to a holder's push carries them sooner).
        durable: True (default): an owner acknowledges another peer's push once its write
            is on the key's other holders, so an acknowledged update survives the owner's
            death while one of them lives. False: once applied, the write going to the
            holders within ``replicate_s`` like the owner's own (a push acknowledged in that
            window dies with the owner; the key never does): about half the messages per
            push when pushers are not the key's only other holder (more than 2 peers).
        batch: every peer's ``ctx.batch_size`` (default 32).
        balance: with SSP(s) or PSP(β, s), s >= 1: a peer that most peers it knows are
            more than ``s / 2`` steps ahead of takes fewer samples per step (down to a
            quarter of ``batch``), and grows back to ``batch`` once they are not, so a
            persistent straggler keeps pace instead of setting it (no coordinator, nothing
            more on the wire). Each update is still pulled alone: its gradient is its own
            batch's mean.
        overlap: True (default): under a barrier with staleness (ASP, SSP(s) and
            PSP(β, s) with s >= 1, DSSP with low >= 1) the next step computes while a
            step's pushes travel, on the values the step before last was answered with.
            An int n >= 1: the next n steps may compute so (at most the staleness; ASP: n),
            with up to n steps' updates unanswered; those computed meanwhile go to each
            owner together, as one push (``barrier.pipeline_depth``). More is faster per
            step; from 2 on a step reads the values with the peer's own unanswered updates
            folded in by ``pull`` on a private view (``OwnerStore.private``; a ``pull``
            that writes in place falls back to the values as answered), but more steps on
            one answer are staler for the others: too stale for a large learning rate.
            False or 0: each step waits for its pushes' answers first (it reads its own
            last update).
        wait_alone_s: a peer that evicted every other peer it knew (no answer from them)
            cannot tell dead peers from a cut link: for this long after the last eviction
            (default 5 s) it keeps its own updates unsettled and PINGs those peers, so
            that, the link mended, the updates reach whichever branch wins, and its job is
            not done meanwhile; then it takes them as settled (its partners dead). A cut
            longer than this ends a job with a model per side; 0: settled at once.
        **overlay: any other ``KademliaConfig`` field (e.g. ``rpc_timeout_s``).

    Raises:
        ConfigError: a bad knob.
    """

    def __init__(self, name: str, barrier: Policy | None = None, replication: int = 3,
                 seed: int = 0, *, ksize: int = 20, alpha: int = 3, poll_s: float = 0.01,
                 replicate_s: float = 0.01, durable: bool = True, batch: int = 32,
                 balance: bool = False, overlap: bool | int = True,
                 wait_alone_s: float = 5.0, **overlay: Any) -> None:
        if not name or not isinstance(name, str):   # as the PS engine's Job
            raise ConfigError(f"a job needs a non-empty str name, got {name!r}")
        if len(name) > MAX_NAME_CHARS:   # its peers' service names hold it, as the PS's do
            raise ConfigError(f"a job name has at most {MAX_NAME_CHARS} characters (it names "
                              f"the job's services), not {len(name):,}: {name[:40]!r}...")
        if barrier is not None and (isinstance(barrier, type)
                                    or not callable(getattr(barrier, "decide", None))):
            # a str here failed in every peer's first barrier check, as an AttributeError,
            # and a class (BSP for BSP(), whose decide is there too) in every peer's
            raise ConfigError(f"barrier must be BSP(), SSP(s), ASP(), PSP(b, s), DSSP(lo, hi) "
                              f"or have decide(me_step, view); got {barrier!r}")
        if not is_int(replication) or not 1 <= replication <= ksize:
            raise ConfigError(f"replication must be an int in [1, ksize={ksize}], "
                              f"got {replication!r}")
        replication = int(replication)   # a numpy int too, kept as a plain one
        if not isinstance(seed, numbers.Integral) or seed < 0:   # as numpy's seeds are
            raise ConfigError(f"seed must be an int >= 0, got {seed!r}")
        fields = {f.name for f in dataclasses.fields(KademliaConfig)}
        unknown = set(overlay) - fields
        if unknown:
            raise ConfigError(f"unknown overlay settings {sorted(unknown)}; see KademliaConfig")
        self.name = name
        self.policy: Policy = barrier if barrier is not None else ASP()
        self.seed = seed
        self.poll_s = poll_s
        self.replicate_s = replicate_s
        if not isinstance(durable, bool):
            raise ConfigError(f"durable must be True or False, got {durable!r}")
        self.durable = durable
        if not isinstance(balance, bool):
            raise ConfigError(f"balance must be True or False, got {balance!r}")
        self.batch, self.balance = batch, balance
        if not isinstance(overlap, numbers.Integral) or not 0 <= overlap <= MAX_OVERLAP:
            raise ConfigError(f"overlap must be True, False or an int in 0..{MAX_OVERLAP}, "
                              f"got {overlap!r}")
        self.overlap = overlap if isinstance(overlap, bool) else int(overlap)
        self.wait_alone_s = wait_alone_s
        if not is_int(alpha) or alpha < 1:
            raise ConfigError(f"alpha must be an int >= 1, got {alpha!r}")   # 0: asks nobody
        try:    # its own checks (min_rpc_timeout_s, rpc_timeout_s_per_mb) raise ValueError
            self.config = KademliaConfig(**{**TRAINING_OVERLAY, **overlay, "ksize": ksize,
                                            "alpha": int(alpha), "replication": replication})
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not 0 < self.config.rpc_timeout_s < math.inf:   # 0: every request times out
            raise ConfigError(f"rpc_timeout_s must be a finite number > 0, got "
                              f"{self.config.rpc_timeout_s!r}")
        self._schedule: Schedule | None = None
        self._push: Push | None = None
        self._pull: Pull | None = None
        self._stop: Stop | None = None

    def register_schedule(self, fn: F) -> F:
        """``schedule(ctx) -> list of keys`` this peer works on this step."""
        _function("register_schedule", fn)
        self._schedule = fn
        return fn

    def register_push(self, fn: F) -> F:
        """``push(ctx, values) -> {key: update}``: runs on every peer each step; ``{}``:
        no update this step. None (a missing ``return``) fails the job."""
        _function("register_push", fn)
        self._push = fn
        return fn

    def register_pull(self, fn: F) -> F:
        """``pull(store, updates)``: runs on the owner of the pushed keys; reads
        ``store.get(key) -> (value, clock)``, writes ``store.set(key, value)``."""
        _function("register_pull", fn)
        self._pull = fn
        return fn

    def register_barrier(self, policy: Policy) -> Policy:
        """Replace the barrier policy given to the constructor."""
        if not hasattr(policy, "decide"):
            raise ConfigError("a barrier is a Policy: BSP(), SSP(s), ASP(), PSP(b, s), ...")
        self.policy = policy
        return policy

    def register_stop(self, fn: F) -> F:
        """``stop(ctx) -> bool``: checked after each step; True ends this peer's loop."""
        _function("register_stop", fn)
        self._stop = fn
        return fn

    def spec(self, keys: Iterable[str] = ()) -> JobSpec:
        """The job as its peers run it; ``keys``: the model's (a run's ``init``: its values'
        sizes go too), the only ones ``schedule`` may name.

        Raises:
            ConfigError: schedule, push, pull or stop is missing (before, a missing pull
                failed at the first push an owner folded).
        """
        missing = [n for n, f in (("schedule", self._schedule), ("push", self._push),
                                  ("pull", self._pull), ("stop", self._stop)) if f is None]
        if missing:
            raise ConfigError(f"job {self.name!r} has no {', '.join(missing)}: register "
                              f"{'it' if len(missing) == 1 else 'them'} with "
                              + ", ".join(f"job.register_{n}(fn)" for n in missing))
        assert (self._schedule is not None and self._push is not None and self._pull is not None
                and self._stop is not None)
        return JobSpec(self.name, self._schedule, self._push, pull=self._pull, stop=self._stop,
                       policy=self.policy, seed=self.seed, poll_s=self.poll_s,
                       replicate_s=self.replicate_s, durable=self.durable,
                       batch=self.batch, balance=self.balance, overlap=self.overlap,
                       wait_alone_s=self.wait_alone_s, keys=frozenset(keys),
                       sizes=_sizes(keys))

    def simulate(self, peers: int, init: dict[str, Any], **options: Any) -> Any:
        """Run the job on ``peers`` in-process peers (``simrun.SimRun``; options there) and
        return its ``SimResult``: the final model read from the overlay, steps, timings."""
        from .simrun import SimRun  # the simulator is only needed here

        if options.get("data") is not None:
            _function("data", options["data"])
        return SimRun(self, peers, init, **options).run()

    def run(self, cluster: Any, peers: int, init: dict[str, Any], *,
            data: Callable[[int], Any] | None = None, timeout_s: float = 300.0,
            on_poll: Callable[[Any, float], None] | None = None) -> Any:
        """Run the job on ``peers`` core services on ``cluster``'s workers (several per worker
        when there are more peers than workers) and return its ``RunResult``: the final
        model read from the overlay, steps, seconds, updates (``cluster_run.ClusterRun``).
        ``on_poll(run, seconds)`` runs on the driver after each progress poll; it may read
        keys (``run.read``) or add a peer to the running job (``run.add_peer()``).

        Raises:
            RemoteError: a peer's callback raised. ActorpyTimeout: not done in ``timeout_s``.
        """
        from .cluster_run import ClusterRun

        if data is not None:
            _function("data", data)
        return ClusterRun(self, cluster, peers, init, data=data, timeout_s=timeout_s,
                          on_poll=on_poll).run()

    def run_overlay(self, address: str, init: dict[str, Any], *,
                    secret: str | bytes | None = None, secret_file: str | None = None,
                    data: Callable[[int], Any] | None = None, timeout_s: float = 300.0,
                    on_poll: Callable[[Any, float], None] | None = None) -> Any:
        """Run the job on standalone peers (``actorpy peer``, no manager): join the overlay
        as a light client through the peer at ``address`` (``tcp://HOST:PORT``, with the
        cluster secret), find every live peer, and run the job on all of them, each one
        training peer (``data(index)`` on each); returns its ``RunResult`` like ``run``.
        The overlay's store starts empty for each job.

        Raises:
            AuthError: another secret there. ActorpyTimeout: no peer answered at
            ``address``, or not done in ``timeout_s``. RemoteError: a callback raised.
        """
        from .overlay_run import run_overlay

        if data is not None:
            _function("data", data)
        return run_overlay(self, address, init, secret=secret, secret_file=secret_file,
                           data=data, timeout_s=timeout_s, on_poll=on_poll)


def _sizes(init: Any) -> dict[str, int]:
    """The bytes of each value in ``init`` (a mapping; values that cannot be stored left
    out: the run refuses them), read off each value (``Blob.of`` would copy a GPU tensor)."""
    sizes = {}
    for name, value in (init.items() if isinstance(init, Mapping) else ()):
        if unstorable(value) is None:
            nbytes = getattr(value, "nbytes", None)
            sizes[name] = int(nbytes) if nbytes is not None else memoryview(value).nbytes
    return sizes

"""The server shard's logic, sans I/O: worker steps, the barrier, deferred releases, joins,
deaths, stragglers, LB-BSP batches, validated and aggregated updates, checkpoint timing.

Every public method takes one event and returns what to send: a list of :class:`Answer`
(reply to this worker now) and :class:`CheckpointDue` (write this snapshot). A worker held at
the barrier simply gets no Answer until a later event lets it go; the shell keeps its request
and answers it then. Time comes from an injected Clock, randomness from a seeded rng, so the
whole server runs under a FakeClock in tests.

Updates are buffered and folded into the model (``pull``) right before workers are released
after a push or a departure, so a released worker always sees every update received so far,
and under BSP ``pull`` runs once per round with the batch-size-weighted mean of the round's
updates (ordered by worker slot, so the result does not depend on arrival order). Under the
asynchronous policies (ASP, SSP with staleness > 0, PSP, DSSP) each buffered update is its
own step, as it would have been had it arrived alone: a held worker's update is never
shrunk by being averaged with whatever else waited in the buffer.
"""
from __future__ import annotations

import random
from collections import abc
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from actorpy.barrier import ASP, BSP, DSSP, PSP, SSP
from actorpy.clock import Clock
from actorpy.errors import ConfigError
from actorpy.ids import NodeId
from actorpy.values import yes_or_no
from engines.param.aggregate import combine
from engines.param.checkpoint import Snapshot
from engines.param.errors import CallbackError, KeyNotLocal, UpdateError
from engines.param.gate import Gate, follower_policy
from engines.param.kinds import Join, Push, Reply, Status
from engines.param.store import Progress, Store, check_update
from engines.param.tuning import Balancer, StragglerWatch

AGGREGATES = ("mean", "sum", "each")


@dataclass(frozen=True)
class ShardConfig:
    """How one shard runs (the same for every shard of a job, but ``shard``)."""

    job: str = "job"
    shard: int = 0
    shards: int = 1
    policy: Any = BSP()
    aggregate: str = "mean"   # "mean" (weighted by batch), "sum", "each" (one pull per update)
    expected: frozenset[NodeId] = frozenset()  # start barrier: nobody starts before these joined
    batch: int = 1
    balance: bool = False              # LB-BSP batch sizes (coordinator)
    straggler_factor: float | None = None
    straggler_patience: int = 100
    checkpoint_every: int = 0          # pulls between checkpoints; 0: never
    seed: int = 0
    #: 1 when workers compute their next step while their push travels (``overlap``): a
    #: worker is released once it may start the step after the next (computed meanwhile)
    lookahead: int = 0
    closed: bool = False   # a fixed ``workers=`` list: no worker joins later

    @property
    def is_coordinator(self) -> bool:
        return self.shard == 0


@dataclass(frozen=True)
class Callbacks:
    """The server-side callbacks of a job."""

    pull: Callable[[Store, dict[str, Any]], None]
    schedule: Callable[[Store, list[NodeId]], Mapping[NodeId, Sequence[str]]] | None = None
    stop: Callable[[Store], bool] | None = None


@dataclass(frozen=True)
class Answer:
    """Reply ``reply`` to ``worker``'s outstanding request."""

    worker: NodeId
    reply: Reply


@dataclass(frozen=True)
class CheckpointDue:
    """Write ``snapshot`` (the model as it is after the last pull)."""

    snapshot: Snapshot


Action = Answer | CheckpointDue


class ServerCore:
    """One shard of the parameter server (see the module docstring).

    Args:
        config: the shard's settings.
        store: the shard's keys (its ``progress`` becomes the server's table).
        callbacks: pull, schedule, stop.
        clock: where push times come from (DSSP).
    """

    def __init__(self, config: ShardConfig, store: Store, callbacks: Callbacks,
                 clock: Clock) -> None:
        if config.aggregate not in AGGREGATES:
            raise ConfigError(f"aggregate must be one of {AGGREGATES}, got {config.aggregate!r}")
        self.config = config
        self.store = store
        self.progress: Progress = store.progress
        self.progress.now = clock.now
        self._cb = callbacks
        self._clock = clock
        coordinator = config.is_coordinator
        self.gate = Gate(config.policy if coordinator else follower_policy(config.policy),
                         random.Random(config.seed * 1_000_003 + config.shard))
        # asynchronous: each update is a step of its own, a batch goes down to a quarter, not
        # 1 (a few samples at a rate made for the batch diverged); LB-BSP weighs each batch
        floor = max(1, config.batch // 4) if is_asynchronous(config.policy) else 1
        self._balancer = (Balancer(config.batch, min_batch=floor)
                          if config.balance and coordinator else None)
        self._stragglers = (StragglerWatch(config.straggler_factor, config.straggler_patience)
                            if config.straggler_factor is not None and coordinator else None)
        self._expected = set(config.expected)
        self.started = not self._expected
        self.held: dict[NodeId, int] = {}
        self.slots: dict[NodeId, int] = {}
        self.history: dict[NodeId, int] = {}     # every worker ever joined -> last steps
        self.released: set[NodeId] = set()       # stragglers let go (never taken back)
        self._scheduled: dict[NodeId, tuple[str, ...]] = {}
        self._local_keys = tuple(store.local_keys())   # the default schedule: all of ours
        self._orphaned: list[str] = []
        self._pending: list[tuple[int, NodeId, dict[str, Any], int, tuple]] = []
        self._valid: dict[Any, None] = {}   # packed groups' signatures that fit the model
        self._each = config.aggregate == "each" or (config.aggregate == "mean"
                                                    and is_asynchronous(config.policy))
        self._pulls_since_checkpoint = 0
        self.halted: Status | None = None
        self._halt_at: int | None = None       # halt once every live worker reached this
        self._stopped_at: int | None = None
        self._out: list[Action] = []
        self.stalled: str | None = None   # the coordinator's barrier holds every worker

    # ----------------------------------------------------------------- events
    def join(self, join: Join) -> list[Action]:
        """A worker enters the barrier with ``join.step`` steps done (0 for a new one).

        It starts from the slowest live worker's step if that is ahead (a late joiner does
        not drag BSP back), and is held until the start barrier opens."""
        w = join.worker
        if self.halted is not None or w in self.released:
            return [Answer(w, Reply(self.halted or Status.RELEASED, self.history.get(w, 0),
                                    stopped_at=self._stopped_at))]
        steps = self.progress.steps
        floor = min(steps.values()) if steps else self.progress.base_step
        start = max(join.step, floor)
        steps[w] = start
        self.slots[w] = join.slot
        self.history[w] = start
        self.held[w] = start
        self._workers_changed()
        self._expected.discard(w)
        if not self.started:
            return self._maybe_start()
        self._recheck(flush=False)
        return self._flush_out()

    def push(self, worker: NodeId, push: Push) -> list[Action]:
        """A worker completed a step and sends its updates for this shard's keys.

        Raises:
            UpdateError: an unknown key, or a value of the wrong type, shape or dtype (the
                model and the buffer are left untouched).
        """
        w = worker
        if self.halted is not None:   # too late: the model is final; not counted
            return [Answer(w, Reply(self.halted, self.history.get(w, 0),
                                    stopped_at=self._stopped_at))]
        if w not in self.progress.steps:
            return [Answer(w, Reply(Status.RELEASED, self.history.get(w, 0)))]
        self._validate(w, push.updates, push.groups)
        self.progress.steps[w] = self.history[w] = push.step
        self.held[w] = push.step
        if push.updates:
            self._pending.append((self.slots.get(w, 0), w, push.updates, max(push.batch, 0),
                                  push.groups))
        elif not self._pending and self._cb.stop is not None and self._should_stop():
            # a step with no updates runs no pull, after which stop is checked: check it
            # here, or a job whose pushes return nothing would never stop
            self._halt(Status.FINISH)
            return self._flush_out()
        if self._balancer is not None:
            self._balancer.observe(w, push.batch, push.compute_s)
        if self._stragglers is not None:
            self._stragglers.observe(w, push.batch, push.compute_s)
            if self._stragglers.is_straggler(w) and len(self.progress.steps) > 1:
                self.released.add(w)
                self._out.append(Answer(w, Reply(Status.RELEASED, push.step)))
                self._remove(w)
                self._recheck(flush=True)
                return self._flush_out()
        try:
            advance = self.gate.on_push(w, push.step + self.config.lookahead,
                                        self._clock.now(), self.progress.steps)
        except Exception as exc:
            raise self._barrier_failed(exc, w) from exc
        self._recheck(flush=True, first=w if advance else None)
        self._halt_if_reached()
        return self._flush_out()

    def leave(self, worker: NodeId) -> list[Action]:
        """A worker ended, died or was released: it leaves the barrier (and may unblock
        others); the keys it was working on are re-issued at the next schedule."""
        if worker not in self.progress.steps:
            self._expected.discard(worker)
            return self._maybe_start()
        if worker not in self.held:
            self._orphaned.extend(k for k in self._scheduled.get(worker, ())
                                  if self.store.is_local(k))
        self._remove(worker)
        self._expected.discard(worker)
        if not self.started:
            return self._maybe_start()
        self._recheck(flush=True)
        self._halt_if_reached()
        return self._flush_out()

    def halt(self, status: Status = Status.FINISH, at_step: int | None = None) -> list[Action]:
        """Stop: fold what is buffered, answer every held worker ``status``; later pushes
        get the same answer.

        With ``at_step`` (the step at which another shard met the stop condition) the stop
        waits until every live worker completed that many steps here, so every shard ends
        on the same round: under BSP a round whose pushes are still on their way is
        completed, never folded half."""
        if self.halted is None:
            if at_step is not None and self.progress.steps and self.store.step < at_step:
                self._halt_at = at_step if self._halt_at is None else min(self._halt_at, at_step)
                return self._flush_out()
            self._fold()
            if self.halted is None:
                self._halt(status)
        return self._flush_out()

    @property
    def halting(self) -> bool:
        """A stop is due once the workers reach a step (``halt(at_step=...)``)."""
        return self._halt_at is not None and self.halted is None

    # ----------------------------------------------------------------- queries
    def model(self) -> dict[str, Any]:
        """This shard's keys -> values."""
        return self.store.values()

    def snapshot(self) -> Snapshot:
        return Snapshot(self.store.values(), self.store.clocks(),
                        {str(k): v for k, v in self.progress.steps.items()}, self.store.step,
                        self.progress.updates, self.progress.pulls)

    def restore(self, snapshot: Snapshot) -> None:
        """Start from a checkpoint (before any worker joined)."""
        # workers that will not join again (died with the shard's host) count as of the
        # checkpoint: before, a run listed 0 steps for them
        self.history.update({NodeId(w): n for w, n in snapshot.steps.items()})
        self.store.restore(snapshot.values, snapshot.clocks)
        self.progress.base_step = snapshot.base_step
        self.progress.updates = snapshot.updates
        self.progress.pulls = snapshot.pulls

    def stats(self) -> dict[str, Any]:
        """Steps table, join order and counters (plain data, for the driver)."""
        return {"shard": self.config.shard, "steps": dict(self.progress.steps),
                "history": dict(self.history), "held": sorted(self.held),
                "updates": self.progress.updates, "pulls": self.progress.pulls,
                "released": sorted(self.released), "step": self.store.step,
                "halted": None if self.halted is None else self.halted.name,
                "trace": list(self.progress.trace), "stalled": self.stalled}

    # ----------------------------------------------------------------- internals
    def _validate(self, w: NodeId, updates: Mapping[str, Any], groups: tuple = ()) -> None:
        # (typing.Mapping's isinstance goes through typing's __instancecheck__: ~1 us a push)
        if type(updates) is not dict and not isinstance(updates, abc.Mapping):
            raise UpdateError(f"push on worker {w} returned {type(updates).__name__}; it must "
                              "return a dict of key -> update")
        # A packed group whose signature (dtype, keys, shapes) fit the model once fits it
        # always: the model's keys, shapes and dtypes never change. Checked key by key once.
        skip: set[Any] = set()
        if groups:
            known = [sig[2] for sig, _ in groups if sig in self._valid]
            if len(known) == len(groups) and sum(map(len, known)) == len(updates):
                return
            skip = skip.union(*known)
        for key, value in updates.items():
            if key in skip:
                continue
            if not self.store.is_local(key):
                owner = self.store.shard_of(key) if isinstance(key, str) else None
                if owner is None:
                    raise UpdateError(f"the update from worker {w} names unknown key {key!r}; "
                                      f"the model's keys are {self.store.keys()}")
                raise UpdateError(f"the update for key {key!r} reached shard "
                                  f"{self.config.shard}, but shard {owner} holds it")
            fitted = check_update(key, value, self.store.get(key)[0],
                                  f"the update from worker {w}")
            if fitted is not value:   # a numpy scalar for a 0-d key: its 0-d array
                updates[key] = fitted   # (a dict: Push.updates)
        if groups:
            if len(self._valid) > 64:   # a job pushing ever new key sets: keep the latest
                self._valid.clear()
            self._valid.update(dict.fromkeys(sig for sig, _ in groups))

    def _recheck(self, flush: bool, first: NodeId | None = None) -> None:
        """Release every held worker the barrier now lets go (``first`` already decided),
        all in one schedule call."""
        if self.halted is not None or not self.started:
            return
        steps = self.progress.steps
        ready = [first] if first is not None else []
        w = first
        try:
            for w in sorted(self.held):
                if w != first and self.gate.recheck(w, self.held[w] + self.config.lookahead,
                                                    steps):
                    ready.append(w)
        except Exception as exc:
            raise self._barrier_failed(exc, w) from exc
        self.stalled = None if ready or self._halt_at is not None else self.gate.stalled(
            self.held, steps, self.config.closed)   # all held: raises if nobody can join
        if ready:
            self._release(ready, flush)

    def _release(self, workers: list[NodeId], flush: bool) -> None:
        """Answer held ``workers`` GO with fresh values (after folding, if ``flush``)."""
        if flush:
            self._fold()
            if self.halted is not None:   # the fold met the stop condition: all answered
                return
        batches = self._balancer.batches() if self._balancer is not None else {}
        plan = self._schedule(workers)
        everything = None   # the default schedule's values: one dict for every worker
        for w in workers:
            self.held.pop(w, None)
            keys = plan.get(w, ())
            self._scheduled[w] = keys
            if keys is self._local_keys:
                everything = values = everything or self.store.values()
            else:
                values = {k: self.store.get(k)[0] for k in keys if self.store.is_local(k)}
            self._out.append(Answer(w, Reply(Status.GO, self.progress.steps[w], values,
                                             batches.get(w))))

    def _schedule(self, workers: list[NodeId]) -> dict[NodeId, tuple[str, ...]]:
        if self._cb.schedule is None:
            plan = {w: self._local_keys for w in workers}
        else:
            raw = self._call("schedule", self._cb.schedule, self.store, list(workers))
            if not isinstance(raw, Mapping):
                raise CallbackError(f"schedule returned {type(raw).__name__}; it must return "
                                    "a dict of worker -> list of keys")
            strangers = [k for k in raw if k not in self.history]   # ever joined
            if strangers:   # before: ignored, so {0: [...], 1: [...]} trained nothing
                raise CallbackError(f"schedule keyed its plan by {strangers!r}, not by the worker "
                                    f"ids it was given ({list(workers)!r})")
            if any(isinstance(raw.get(w), (str, bytes)) for w in workers):
                raise CallbackError("schedule gave a worker a str: give each a list of keys")
            plan = {w: tuple(raw.get(w, ())) for w in workers}
            unknown = [k for keys in plan.values() for k in keys if self.store.shard_of(k) is None]
            if unknown:
                raise CallbackError(f"schedule named unknown key {unknown[0]!r}; the model's "
                                    f"keys are {self.store.keys()}")
        if self._orphaned and workers:
            taken = {k for keys in plan.values() for k in keys}
            extra = tuple(dict.fromkeys(k for k in self._orphaned if k not in taken))
            plan[workers[0]] = plan[workers[0]] + extra
            self._orphaned.clear()
        return plan

    def _fold(self) -> None:
        """Fold the buffered updates into the model (one pull, or one per update)."""
        if not self._pending:
            return
        pending = sorted(self._pending, key=lambda p: (p[0], p[1]))
        self._pending = []
        count = len(pending)
        saved = (self.store.values(), self.store.clocks())
        try:
            # Each update is let go of once folded (or combined), before pull makes the
            # new values: a large model is not held once more per update buffered.
            if self._each:
                pending.reverse()
                while pending:
                    self._call("pull", self._cb.pull, self.store, dict(pending.pop()[2]))
            else:
                combined = combine(pending, self.config.aggregate)
                pending.clear()
                self._call("pull", self._cb.pull, self.store, combined)
                del combined
        except BaseException:
            self.store.restore(*saved)   # a pull that raised halfway leaves no half-update
            raise
        calls = count if self._each else 1
        self.progress.updates += count
        self.progress.pulls += calls
        self._pulls_since_checkpoint += calls
        every = self.config.checkpoint_every
        if every and self._pulls_since_checkpoint >= every:
            self._pulls_since_checkpoint = 0
            self._out.append(CheckpointDue(self.snapshot()))
        if self._cb.stop is not None and self._should_stop():
            self._halt(Status.FINISH)
        elif self._halt_at is not None and self.store.step >= self._halt_at:
            self._halt(Status.FINISH)

    def _should_stop(self) -> bool:
        try:
            answer = self._cb.stop(self.store)
        except KeyNotLocal:
            return False   # a shard without the keys the stop reads does not vote
        except Exception as exc:
            raise CallbackError(f"stop raised {type(exc).__name__}: {exc} on server shard "
                                f"{self.config.shard}") from exc
        if answer is None:   # a missing `return`: it would never stop, until timeout_s
            raise CallbackError(f"stop returned None on server shard {self.config.shard}; it "
                                "must return True (stop) or False (go on)")
        try:
            return yes_or_no(answer, "stop")
        except TypeError as exc:
            raise CallbackError(f"{exc} (on server shard {self.config.shard})") from None

    def _barrier_failed(self, exc: Exception, worker: NodeId | None) -> CallbackError:
        """A custom barrier raised deciding for ``worker``: told as other callbacks' are."""
        return CallbackError(f"barrier raised {type(exc).__name__}: {exc} on server shard "
                             f"{self.config.shard}, deciding for worker {worker}")

    def _call(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except (UpdateError, CallbackError):
            raise
        except Exception as exc:
            raise CallbackError(f"{name} raised {type(exc).__name__}: {exc} on server shard "
                                f"{self.config.shard}") from exc

    def _halt(self, status: Status) -> None:
        self.halted = status
        self._stopped_at = self.store.step
        for w in sorted(self.held):
            self._out.append(Answer(w, Reply(status, self.held[w], stopped_at=self._stopped_at)))
        self.held.clear()

    def _halt_if_reached(self) -> None:
        """A pending ``halt(at_step=...)`` whose step every live worker has now reached."""
        if self.halting and (not self.progress.steps or self.store.step >= self._halt_at):
            self._fold()
            if self.halted is None:
                self._halt(Status.FINISH)

    def _remove(self, w: NodeId) -> None:
        steps = self.progress.steps
        if steps.keys() == {w}:   # the last one leaving: remember where the job got to
            self.progress.base_step = max(self.progress.base_step, steps[w])
        steps.pop(w, None)
        self.held.pop(w, None)
        self._scheduled.pop(w, None)
        self.gate.forget(w)
        if self._stragglers is not None:
            self._stragglers.forget(w)
        self._workers_changed()

    def _workers_changed(self) -> None:
        if self._balancer is not None:
            self._balancer.set_workers(self.progress.steps)

    def _maybe_start(self) -> list[Action]:
        if not self.started and not self._expected:
            self.started = True
            if self.progress.base_step and self._cb.stop is not None and self._should_stop():
                # a resumed job already past its stop (before: it trained one more step
                # each time it was resumed, as stop is otherwise checked after a pull)
                self._halt(Status.FINISH)
            else:
                self._recheck(flush=False)
        return self._flush_out()

    def _flush_out(self) -> list[Action]:
        out, self._out = self._out, []
        return out


def is_asynchronous(policy: Any) -> bool:
    """Whether workers under ``policy`` move on without waiting for a round (ASP, SSP with
    staleness > 0, PSP, DSSP): then every update is a step of its own (``aggregate="mean"``
    averages only a synchronous round: BSP, or a custom policy).

    >>> is_asynchronous(BSP()), is_asynchronous(SSP(staleness=2)), is_asynchronous(ASP())
    (False, True, True)
    """
    if isinstance(policy, SSP):
        return policy.staleness > 0
    return isinstance(policy, (ASP, PSP, DSSP))

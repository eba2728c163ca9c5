"""What a P2P job's callbacks are given, the job's definition as the runners read it, and
the checks of what the callbacks return.

The vocabulary is the PS engine's (papers.md, Actor's ``Actor_peer``): ``schedule`` picks the
keys a peer works on, ``push`` computes updates from their values, ``pull`` folds updates into a
key on the peer that owns it (the key's closest peer), ``stop`` ends a peer's loop. Callbacks
get explicit context objects, never a global ``P2P.get``.
"""
from __future__ import annotations

import math
import numbers
import sys
import threading
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from actorpy.barrier import ASP, PSP, SSP, Policy
from actorpy.errors import ConfigError
from actorpy.values import as_like, check_model, describe, family, fits, is_int

from .kademlia.rpc import MAX_ARG_CHARS
from .kademlia.values import unstorable


class Timer(IntEnum):
    """The engine's timers (the overlay's are ``kademlia.events.TimerKind``)."""

    COMPUTED = 1      # a simulated compute time is over
    RECHECK = 2       # check the barrier again
    RETRY = 3         # ask again for the key in the token's slot
    REPLICATE = 5     # an owner's write nobody waits on goes to the key's holders
    BEGIN = 7         # begin the next step from the shell's loop (see _begin_step)
    COMPUTE = 8       # compute the step on the service's thread (its keys came in there)
    SENT = 9          # a full step's pushes went out from the I/O thread: count it done


@dataclass
class PeerContext:
    """A peer's view of itself, handed to ``schedule``, ``push`` and ``stop``.

    Attributes:
        address: this peer's overlay address.
        index: its index among the peers the job was started with (data sharding); peers
            that join later get the next indices.
        step: steps this peer has completed.
        rng: this peer's own seeded numpy generator.
        data: what the job's ``data(index)`` gave this peer (None without one).
        peers: the overlay's size, estimated from id density (this peer counted).
        batch_size: the samples this step should use: the job's ``batch``, or with
            ``balance`` this peer's share (smaller while it holds faster peers back).
    """

    address: str
    index: int
    step: int
    rng: np.random.Generator
    data: Any = None
    peers: int = 1
    batch_size: int = 32


class OwnerStore:
    """The keys held by the peer running ``pull``: ``get(key) -> (value, clock)`` and
    ``set(key, value)``, as on a PS server. A ``set`` bumps the key's clock and is replicated
    to the key's ``replication`` closest peers after ``pull`` returns. ``pull`` may set only
    the key it folds (``folding``), whatever other keys this peer holds: another key's owner
    is whichever peer is closest to it, which changes with the placement (a replica set here
    became a branch of its own, lost to the owner's, while a key held nowhere here failed).

    Attributes:
        sender: the address of the peer whose updates these are.
        sender_step: the steps that peer had completed when it pushed.
        private: True when a pipelined peer folds its own updates not answered yet into its
            private copy of the values, to compute its next step from (``read_own``):
            nothing set there is stored. A ``pull`` that keeps counts or logs may skip them.
        folding: the key whose update ``pull`` folds, the only one it may set (None: any).
    """

    def __init__(self, read: Callable[[str], tuple[Any, int] | None], sender: str,
                 sender_step: int, private: bool = False, folding: str | None = None) -> None:
        self._read = read
        self.folding = folding      # the key ``set`` may write (None: any key held)
        self.sender = sender
        self.sender_step = sender_step
        self.private = private
        self.written: dict[str, Any] = {}

    def get(self, key: str) -> tuple[Any, int]:
        """The value and clock of ``key`` as held here (after this pull's own sets): of a
        key other than the one folded, this peer's replica, which may be behind its owner's.

        Raises:
            KeyError: this peer holds no such key (pull may only read the keys it owns).
        """
        found = self._read(key)
        if found is None:
            raise KeyError(f"this peer holds no key {key!r}: pull runs on a key's owner and "
                           "may only read the keys it holds")
        value, clock = found
        if key in self.written:
            return self.written[key], clock + 1
        return value, clock

    def set(self, key: str, value: Any) -> None:
        """Replace ``key``'s value (its clock goes up by one). A numpy scalar of a 0-d key's
        dtype is taken as its 0-d array (``w + u`` on 0-d arrays gives one), as on a PS server.

        Raises:
            KeyError: ``key`` is not the key being folded (or this peer holds no such key).
            TypeError: ``value`` is not of the type, shape and dtype the key holds.
        """
        if self.folding is not None and key != self.folding:
            raise KeyError(f"pull set key {key!r} while folding {self.folding!r}: pull runs "
                           f"on {self.folding!r}'s owner and may set only that key (another "
                           f"key's owner may be another peer; push an update to it instead)")
        found = self._read(key)
        if found is None:
            raise KeyError(f"this peer holds no key {key!r}: pull runs on a key's owner and "
                           "may only set the keys it holds")
        value = zero_d(value, found[0])
        problem = misfit(value, found[0])
        if problem:
            raise TypeError(f"pull set key {key!r} to {problem}: use values of the same "
                            "type, shape and dtype")
        value = as_like(value, found[0])   # a big-endian model stays so
        if isinstance(value, np.ndarray):   # stored without a copy: read-only, as on a PS
            value.setflags(write=False)     # server (a later write changed the stored copy)
        self.written[key] = value


_BYTES = (bytes, bytearray, memoryview)


def zero_d(value: Any, like: Any) -> Any:
    """``value`` as a 0-d array if it is a numpy scalar and ``like`` a 0-d array (numpy's
    arithmetic on 0-d arrays gives scalars; the PS engine's ``check_update`` takes them
    too), else ``value`` itself; ``misfit`` then judges the dtype.

    >>> zero_d(np.float64(1.0), np.array(0.0)).shape, type(zero_d(1.0, np.array(0.0)))
    ((), <class 'float'>)
    """
    if isinstance(value, np.generic) and type(like) is np.ndarray and like.shape == ():
        return np.asarray(value)
    return value


def misfit(value: Any, like: Any) -> str | None:
    """None if ``value`` can replace ``like`` on the overlay (the same kind, shape and
    dtype; any bytes for bytes), else what is wrong, for an error message.

    >>> misfit(np.zeros(3), np.ones(3)) is None, misfit([0.0], np.ones(1))
    (True, 'a list, where the model holds a float64 array of shape (1,)')
    """
    ok = isinstance(value, _BYTES) if isinstance(like, _BYTES) else fits(value, like)
    return None if ok else f"{describe(value)}, where the model holds {describe(like)}"


Schedule = Callable[[PeerContext], list[str]]
Push = Callable[[PeerContext, dict[str, Any]], Mapping[str, Any]]
Pull = Callable[[OwnerStore, dict[str, Any]], None]
Stop = Callable[[PeerContext], bool]


def check_run(peers: int, init: Mapping[str, Any]) -> None:
    """What every run of a job needs: a peer, and a model with a key (with none, a
    ``schedule`` naming a key waited for it until the run's timeout) that the overlay can
    store (``actorpy.values.check_model``, as the PS engine checks its ``init``).

    Raises:
        ConfigError: no peer, an empty ``init``, a key over ``MAX_ARG_CHARS`` (256)
            characters, or a value of it the overlay cannot store.
    """
    if not is_int(peers) or peers < 1:
        raise ConfigError(f"a P2P job needs an int number of peers >= 1, got {peers!r}")
    check_model(init, bytes_ok=True)
    if not init:
        raise ConfigError("init must name at least one key")
    for key, value in init.items():   # a str or structured array failed in the overlay
        if len(key) > MAX_ARG_CHARS:
            # GET and PUSH carry the key as an rpc arg: its owner dropped every one of them
            # (and evicted the sender), and the run hung until its timeout
            raise ConfigError(f"init key {key[:40]!r}... has {len(key):,} characters, over the "
                              f"limit of {MAX_ARG_CHARS} (a key travels as an rpc argument)")
        why = unstorable(value)
        if why is not None:
            raise ConfigError(f"init[{key!r}] is {why}: the overlay cannot store it")


def _no_pull(store: OwnerStore, updates: dict[str, Any]) -> None:
    raise ConfigError("this job has no pull: register one with job.register_pull")


@dataclass(frozen=True)
class JobSpec:
    """A P2P job as its peers run it (``Job`` builds it from its registered callbacks).

    Attributes:
        name: the job's name.
        schedule, push, pull, stop: the callbacks (see the module docstring).
        policy: the barrier (BSP, SSP(s), ASP, PSP(β, s), DSSP, or any ``Policy``).
        seed: seeds every peer's rngs (with the peer's index).
        poll_s: how long a blocked peer waits before checking the barrier again (it also
            re-checks at once when a peer it waits on reports a new step).
        retry_s: how long to wait before asking again for a key its owner does not hold yet.
        replicate_s: how long an owner's write that nobody waits on (its own push's) may
            wait for a round to the key's holders; answers to their pushes carry it sooner.
        keys: the model's keys (a run's ``init``): ``schedule`` may name only these (empty:
            not checked).
        sizes: the bytes of each key's value (a run's ``init``): a peer's requests wait for
            them from its first (``sizes.py``); a read of a size never seen waits first for
            a small answer, then for the largest a value may be.
        run: this run's token, carried by its GET and PUSH calls: an owner refuses a call
            of another run (standalone peers serve one job after another, and a call of
            the last one, retried by its node, must not reach the next one's model).
        durable: an owner answers another peer's push once its write is on the key's other
            holders (else once applied; see ``Job``).
        quick: the model is small (``QUICK_MODEL_BYTES``), so a shell may handle overlay
            requests on its node's I/O thread while the peer is idle (``pull`` runs there
            then, ``schedule`` and ``push`` never).
        batch: ``ctx.batch_size`` of every peer (with ``balance``: the most a peer uses).
        balance: a peer that faster peers wait on shrinks its batch (down to a quarter;
            ``barrier.balanced_batch``), so the peers' steps keep pace; needs a staleness
            of 1 or more (SSP, PSP).
        overlap: under a barrier with staleness the next steps compute while a step's
            pushes travel: True, or how many steps' updates may be unanswered
            (``barrier.pipeline_depth``; see ``Job``).
        wait_alone_s: how long after evicting its last partner a peer alone keeps its own
            updates unsettled (and its job not done) in case the partner was cut off, not
            dead (see ``Job``); 0: settled at once.
    """

    name: str
    schedule: Schedule
    push: Push
    pull: Pull = _no_pull
    stop: Stop = field(default=lambda ctx: False)
    policy: Policy = field(default_factory=ASP)
    seed: int = 0
    poll_s: float = 0.01
    retry_s: float = 0.05
    replicate_s: float = 0.01
    keys: frozenset[str] = frozenset()
    sizes: Mapping[str, int] = field(default_factory=dict)
    run: int = 0
    quick: bool = False
    durable: bool = True
    batch: int = 32
    balance: bool = False
    overlap: bool | int = True
    wait_alone_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("poll_s", "retry_s", "replicate_s"):
            value = getattr(self, name)
            if (not isinstance(value, numbers.Real) or isinstance(value, bool)
                    or not math.isfinite(value) or value <= 0):
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        wait = self.wait_alone_s
        if not isinstance(wait, numbers.Real) or isinstance(wait, bool) \
                or not math.isfinite(wait) or wait < 0:
            raise ConfigError(f"wait_alone_s must be a number of seconds >= 0, got {wait!r}")
        if not is_int(self.batch) or self.batch < 1:
            raise ConfigError(f"batch must be an int >= 1, got {self.batch!r}")
        object.__setattr__(self, "batch", int(self.batch))   # np.int64(64) too, kept plain
        if self.balance and balance_bound(self.policy) is None:
            raise ConfigError(
                f"balance=True needs a barrier with a staleness of 1 or more (SSP(s), "
                f"PSP(sample, s)), not {self.policy!r}: a peer tells that faster peers wait "
                f"on it by how far ahead of it they are, up to that bound")


def read_own(pull: Pull, values: Mapping[str, tuple[Any, int]],
             pending: Iterable[tuple[int, str, Any]], sender: str) -> dict[str, Any]:
    """Read-your-writes for a pipelined peer: ``values`` (key -> (value, clock), as the owners
    last answered) with this peer's ``pending`` updates ((step, key, update), in step order:
    out or waiting, not answered yet) folded in by ``pull``, as the owners will fold them.
    ``pull`` runs on a private view (``OwnerStore.private``): arrays read-only, tensors
    cloned, nothing stored. So a step that computes while its peer's pushes travel misses
    only the others' updates meanwhile, not its own.

    Raises:
        whatever ``pull`` raises there (a ``pull`` that writes in place, or reads a key
        this peer does not hold): the caller then reads ``values`` as they are.

    >>> def pull(store, updates):
    ...     for k, u in updates.items():
    ...         store.set(k, store.get(k)[0] - u)
    >>> read_own(pull, {"w": (np.zeros(2), 3)}, [(3, "w", np.ones(2)), (4, "w", np.ones(2))],
    ...          "me")["w"].tolist()
    [-2.0, -2.0]
    """
    view = {key: (_private(value), clock) for key, (value, clock) in values.items()}
    for step, key, update in pending:
        if key not in view:
            continue
        store = OwnerStore(view.get, sender, step, private=True, folding=key)
        pull(store, {key: _private(update)})
        for written, value in store.written.items():
            view[written] = (value, view[written][1] + 1)
    return {key: value for key, (value, _) in view.items()}


def _private(value: Any) -> Any:
    """``value`` as a private pull may read it: a read-only view of an array (no copy), a
    clone of a tensor (which has no read-only flag)."""
    if isinstance(value, np.ndarray):
        view = value.view()
        view.flags.writeable = False
        return view
    if family(value) == "torch":
        return value.clone()
    return value


def own_copy(value: Any) -> Any:
    """A copy of a value read from the overlay that its reader owns, of the same family: an
    array's copy, a tensor's clone (before, a torch model came back from a run as numpy
    arrays), bytes as they are.

    >>> own_copy(np.frombuffer(b"\\0" * 8)).flags.writeable
    True
    """
    if isinstance(value, np.ndarray):
        return np.array(value)
    if family(value) == "torch":
        return value.clone()
    return value


def balance_bound(policy: Policy) -> int | None:
    """The staleness a balancing peer keeps the others' lead under, or None if ``policy``
    has none to go by (BSP, pBSP, ASP, a custom policy)."""
    staleness = getattr(policy, "staleness", None)
    if isinstance(policy, (SSP, PSP)) and isinstance(staleness, int) and staleness >= 1:
        return staleness
    return None


def stacked(updates: list[Any]) -> Any:
    """One array of ``updates`` (arrays of one key: the same type, shape and dtype) along a
    new first axis, so a batch of them travels as one value.

    >>> stacked([np.zeros(2), np.ones(2)]).tolist()
    [[0.0, 0.0], [1.0, 1.0]]
    """
    if family(updates[0]) == "numpy":
        return np.stack(updates)
    return sys.modules["torch"].stack(updates)


def fails_job(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a job's callback, fails the job (and not the peer): any
    ``Exception``, a ``SystemExit`` (a ``sys.exit()`` in ``push``), and a
    ``KeyboardInterrupt`` raised off the main thread. Callbacks run on a peer service's
    thread, which either would end: its peer, alive, then served no job again (a standalone
    peer's process stayed up with a dead service). Ctrl-C on the main thread (``simulate``)
    still stops the program."""
    if isinstance(exc, (Exception, SystemExit)):
        return True
    return isinstance(exc, KeyboardInterrupt) \
        and threading.current_thread() is not threading.main_thread()


def run_data(data: Callable[[int], Any] | None, index: int) -> Any:
    """The job's ``data(index)`` for one peer (None without one); a ``SystemExit`` it raises
    becomes an error of the job's request, as any exception of it does (``fails_job``)."""
    if data is None:
        return None
    try:
        return data(index)
    except Exception:
        raise
    except BaseException as exc:
        if not fails_job(exc):
            raise
        raise RuntimeError(f"data raised {type(exc).__qualname__}: {exc}") from exc


def scheduled_keys(keys: Any, model: frozenset[str]) -> list[str]:
    """``schedule``'s answer as a list of keys of the model (``model``: its keys; empty: not
    checked).

    Raises:
        TypeError: not a list of str. KeyError: a key the model does not have (it would
            be asked for forever: no owner ever holds it).
    """
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise TypeError(f"schedule returned {type(keys).__name__}; it must return a list "
                        "of keys")
    keys = list(keys)
    for key in keys:
        if not isinstance(key, str) or (model and key not in model):
            raise KeyError(f"schedule named {key!r}, which is not a key of the model "
                           f"{sorted(model)}")
    return keys


def checked_updates(updates: Any, values: dict[str, Any], peer: str) -> dict[str, Any]:
    """``push``'s answer on ``peer``, checked before anything is sent: a dict with an update
    for some of this step's keys (``{}``: none this step), each of the type, shape and dtype
    of the value pushed from (a numpy scalar of a 0-d key's dtype: as its 0-d array).

    Raises:
        TypeError: not a dict (None: a missing ``return``), or an update that does not fit
            its key.
        KeyError: an update for a key this step did not schedule (its owner could not
            take it: it would be retried forever).
    """
    if updates is None:
        raise TypeError(f"push on peer {peer} returned None; return a dict of key -> update, "
                        "or {} for no update this step")
    if not isinstance(updates, Mapping):
        raise TypeError(f"push returned {type(updates).__name__}; it must return a dict of "
                        "key -> update")
    updates = dict(updates)
    for key, update in updates.items():
        if key not in values:
            raise KeyError(f"push returned an update for {key!r}, which is not one of this "
                           f"step's keys {sorted(values)} (schedule names them)")
        update = updates[key] = zero_d(update, values[key])
        problem = misfit(update, values[key])
        if problem:
            raise TypeError(f"push returned for key {key!r} {problem}: return updates of "
                            "the same type, shape and dtype as the values")
    return updates

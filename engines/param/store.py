"""The server's key store as callbacks see it: key -> (value, clock), keys sharded over
server shards by a stable hash.

A value is a numpy array or a torch tensor. Every key's type, shape and dtype are fixed by
``init``: an update or a ``set`` that does not fit raises :class:`UpdateError` naming the key
and both shapes, before anything changes. numpy values are stored read-only, because replies
send them to workers without a copy: ``pull`` builds new arrays (``w - lr * g``) instead of
changing stored ones in place.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from actorpy.errors import ConfigError
from actorpy.ids import NodeId
from actorpy.values import as_like, describe, family, fits, is_int
from engines.param.errors import KeyNotLocal, UpdateError


def shard_of(key: str, shards: int) -> int:
    """The shard holding ``key``: blake2b of its UTF-8 bytes (never ``hash()``, which
    differs per process), modulo ``shards``.

    >>> shard_of("w", 1), shard_of("w", 4) == shard_of("w", 4)
    (0, True)
    """
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def plan_shards(keys: Iterable[str], shards: int) -> dict[str, int]:
    """``{key: shard}`` for every key (see :func:`shard_of`)."""
    if not is_int(shards) or shards < 1:
        raise ConfigError(f"servers must be an int >= 1, got {shards!r}")
    return {k: shard_of(k, shards) for k in keys}


_DETACH = ("send value.detach() (a tensor in autograd's graph would keep that graph in the "
           "model, and every later set would grow it)")


def check_init(init: Mapping[str, Any]) -> None:
    """Refuse, before a job starts, a torch ``init`` value that requires grad (an
    ``nn.Parameter``, say): the updates and sets that follow it would too, and the shard
    refuses those (:func:`check_update`).

    Raises:
        ConfigError: naming the key.
    """
    for key, value in init.items():
        if family(value) == "torch" and value.requires_grad:
            raise ConfigError(f"init[{key!r}] is {describe(value)} that requires grad; pass "
                              "value.detach() (for a module: {k: v.detach() for k, v in "
                              "model.state_dict().items()})")


def check_update(key: str, value: Any, like: Any, what: str) -> Any:
    """``value`` if it fits ``like``, else :class:`UpdateError` (``what`` says who sent it).
    A numpy scalar (``np.float64``...) for a 0-d key is returned as the 0-d array, if its
    dtype is the key's: numpy's arithmetic on a 0-d array (``b - 0.1 * u``) gives one."""
    if fits(value, like):
        if type(value) is not np.ndarray and getattr(value, "requires_grad", False):
            raise UpdateError(f"{what} for key {key!r} is {describe(value)} that requires "
                              f"grad; {_DETACH}")
        return value
    if isinstance(value, np.generic) and type(like) is np.ndarray and like.shape == ():
        array = np.asarray(value)
        if fits(array, like):
            return array
    raise UpdateError(f"{what} for key {key!r} is {describe(value)}, but the model's "
                      f"{key!r} is {describe(like)}; return values of the same type, "
                      "shape and dtype as the ones received")


@dataclass
class Progress:
    """What the server knows of its workers, shared read-only with the Store."""

    steps: dict[NodeId, int] = field(default_factory=dict)  # live workers' completed steps
    base_step: int = 0      # the global step a resumed job starts from
    updates: int = 0        # worker updates folded into the model
    pulls: int = 0          # times pull ran
    trace: list[dict[str, float]] = field(default_factory=list)   # Store.record rows
    now: Callable[[], float] = lambda: 0.0                         # the server's clock


class Store:
    """One shard's share of the model, handed to ``schedule``, ``pull`` and ``stop``.

    Args:
        values: this shard's keys -> initial values.
        key_map: every key of the model -> the shard holding it.
        shard: this shard's index.
        progress: the server's worker table (read here, written by the server).
    """

    def __init__(self, values: Mapping[str, Any], key_map: Mapping[str, int], shard: int,
                 progress: Progress | None = None) -> None:
        self._key_map = dict(key_map)
        self._shard = shard
        self._values: dict[str, Any] = {}
        self._clocks: dict[str, int] = {}
        self.progress = progress if progress is not None else Progress()
        for key in sorted(values):
            if key_map.get(key) != shard:
                raise ConfigError(f"key {key!r} does not belong to shard {shard}")
            value = values[key]
            if family(value) is None:
                raise ConfigError(f"init[{key!r}] is {describe(value)}; values must be numpy "
                                  "arrays or torch tensors (wrap scalars: np.array(0.0))")
            self._values[key] = _frozen(value)
            self._clocks[key] = 0

    # ----------------------------------------------------------- what callbacks use
    def get(self, key: str) -> tuple[Any, int]:
        """``(value, clock)`` of ``key``; the clock counts the times it was set (Actor's
        timestamp).

        Raises:
            KeyNotLocal: another shard holds ``key``; KeyError: no such key.
        """
        self._local(key)
        return self._values[key], self._clocks[key]

    def set(self, key: str, value: Any) -> None:
        """Replace ``key``'s value (same type, shape and dtype) and advance its clock. A
        numpy value whose dtype differs from the model's in byte order alone is stored in
        the model's (``w + u`` on a big-endian ``w`` is native-order); a numpy scalar of the
        key's dtype, for a 0-d key, as a 0-d array (``b - 0.1 * u`` on a 0-d ``b`` is one).

        Raises:
            UpdateError: the value does not fit; KeyNotLocal / KeyError as for ``get``.
        """
        self._local(key)
        like = self._values[key]
        value = check_update(key, value, like, "pull set a value")
        self._values[key] = _frozen(as_like(value, like))   # a big-endian model stays so
        self._clocks[key] += 1

    def keys(self) -> list[str]:
        """Every key of the model (on all shards), sorted."""
        return sorted(self._key_map)

    def local_keys(self) -> list[str]:
        """The keys this shard holds, sorted."""
        return sorted(self._values)

    def is_local(self, key: str) -> bool:
        return key in self._values

    def worker_num(self) -> int:
        """Workers currently taking part."""
        return len(self.progress.steps)

    @property
    def step(self) -> int:
        """Steps every live worker has completed (the slowest's count; what BSP rounds
        count). Before any worker joined, the step the job (re)started from."""
        steps = self.progress.steps
        return min(steps.values()) if steps else self.progress.base_step

    @property
    def updates(self) -> int:
        """Worker updates folded into the model so far (on this shard)."""
        return self.progress.updates

    def steps(self) -> dict[NodeId, int]:
        """Each live worker's completed steps."""
        return dict(self.progress.steps)

    def record(self, **metrics: float) -> None:
        """Add a row to the run's trace (``Run.stats.trace``): the metrics plus the server's
        time ``t`` (seconds), ``updates`` and ``step``. For training curves::

            store.record(loss=float(loss))
        """
        p = self.progress
        p.trace.append({"t": p.now(), "updates": float(p.updates), "step": float(self.step),
                        **{k: float(v) for k, v in metrics.items()}})

    # ----------------------------------------------------------- what the server uses
    @property
    def shard(self) -> int:
        return self._shard

    def shard_of(self, key: str) -> int | None:
        return self._key_map.get(key)

    def clocks(self) -> dict[str, int]:
        return dict(self._clocks)

    def values(self) -> dict[str, Any]:
        """This shard's keys -> values (the stored objects, not copies)."""
        return dict(self._values)

    def restore(self, values: Mapping[str, Any], clocks: Mapping[str, int]) -> None:
        """Replace every value and clock at once (from a checked checkpoint)."""
        if set(values) != set(self._values) or set(clocks) != set(self._values):
            raise ConfigError("restore needs exactly this shard's keys")
        for key, value in values.items():
            check_update(key, value, self._values[key], "the checkpoint")
        for key, value in values.items():
            self._values[key] = _frozen(value)
            self._clocks[key] = int(clocks[key])

    def _local(self, key: str) -> None:
        if key in self._values:
            return
        owner = self._key_map.get(key)
        if owner is None:
            raise KeyError(f"no key {key!r} in the model; its keys are {self.keys()}")
        raise KeyNotLocal(f"key {key!r} is held by server shard {owner}, and this callback "
                          f"runs on shard {self._shard} (which holds {self.local_keys()})")


def _frozen(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        value.setflags(write=False)   # one call (reading .flags builds an object each time)
    return value

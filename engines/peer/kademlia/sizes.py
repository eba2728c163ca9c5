"""How long a request that moves a value may take: ``rpc_timeout_s`` plus an allowance per
byte (``KademliaConfig.rpc_timeout_s_per_mb``) for the value it carries and for the value
its answer may bring back (pure arithmetic: sizes in, seconds out; no clock read).

A STORE carries its value, a CALL may carry one, and a FIND_VALUE or a CALL may bring one
back. What comes back is reckoned from what this node has seen of the key: the last value
of it that went through the node in any message, sent or received, or the copy it holds,
whichever is larger (a key's values keep their size: a model's weights; a CALL that pushes
an update is answered with the key's value, of the update's size). A node learns a key's
size from the values it stores, writes, pushes and reads, so it needs no new message: a
holder "advertises" a size by answering. A read of a key the node has seen nothing of
waits ``rpc_timeout_s``, as any small request; if that runs out, its retry waits for the
largest answer that can come (``max_value_bytes``), and the first try's answer is taken
until then too (``ops._on_timeout``), so a live holder of a large value is neither given up
on nor evicted, and the size is known from then on.

>>> config = KademliaConfig(rpc_timeout_s=0.1, rpc_timeout_s_per_mb=0.01)
>>> sizes = ValueSizes()
>>> store = Store(1, KadId(1), KadId(7), bytes(200_000_000), ttl_s=60.0)
>>> round(sizes.wait_s(config, store, None), 3)      # 200 MB sent: 0.1 s + 2 s
2.1
>>> read = FindValue(2, KadId(1), KadId(7))
>>> round(sizes.wait_s(config, read, None), 3)       # then read back: the same size
2.1
>>> other = FindValue(3, KadId(1), KadId(8))          # never seen: a small request's wait,
>>> sizes.wait_s(config, other, None), round(sizes.wait_s(config, other, None, retry=True), 2)
(0.1, 2.78)
"""
from __future__ import annotations

from .events import KademliaConfig
from .ids import KadId
from .messages import Call, FindValue, Kind, Message, Store
from .storage import Storage

#: the unit of ``rpc_timeout_s_per_mb``
MB = 1_000_000
#: requests whose answer may bring a value back
BRINGS_VALUE = frozenset({Kind.FIND_VALUE, Kind.CALL})


class ValueSizes:
    """The size of the last value seen per key (at most ``max_keys``, least recent dropped).

    Args:
        max_keys: how many keys' sizes are kept.
    """

    def __init__(self, max_keys: int = 4096) -> None:
        self.max_keys = max_keys
        self._sizes: dict[int, int] = {}

    def note(self, key: int, nbytes: int) -> None:
        """A value of ``nbytes`` bytes under ``key`` was sent or received."""
        self._sizes.pop(key, None)
        if len(self._sizes) >= self.max_keys:
            del self._sizes[next(iter(self._sizes))]
        self._sizes[key] = nbytes           # most recent last

    def expected(self, key: int, storage: Storage | None) -> int | None:
        """The size of ``key``'s value as far as this node knows (None: nothing seen)."""
        seen = self._sizes.get(key)
        record = storage.record(KadId(key)) if storage is not None else None
        held = record.value.nbytes if record is not None else None
        if seen is None or held is None:
            return held if seen is None else seen
        return max(seen, held)

    def wait_s(self, config: KademliaConfig, message: Message, storage: Storage | None,
               retry: bool = False) -> float:
        """How long to wait for the answer to ``message`` (a STORE, FIND_VALUE or CALL
        about to be sent; its value's size is noted). ``retry``: it is sent again after a
        timeout (a read of a size never seen then allows for ``max_value_bytes``)."""
        nbytes = 0
        if isinstance(message, (Store, Call)) and message.value is not None:
            nbytes = message.value.nbytes
            self.note(message.key, nbytes)
        if isinstance(message, (FindValue, Call)):
            back = self.expected(message.key, storage)
            nbytes += (config.max_value_bytes if retry else 0) if back is None else back
        return config.rpc_timeout_s + config.rpc_timeout_s_per_mb * nbytes / MB

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

The allowance per MB follows the link to each contact (``LinkPace``): every answered STORE,
FIND_VALUE or CALL that moved ``MIN_SAMPLE_BYTES`` or more, out and back, gives a pace, its
round trip per MB moved (latency and queueing included: slow-side). A request waits
``max(rpc_timeout_s_per_mb, MARGIN x the slowest of the contact's last WINDOW paces)`` per
MB, the pooled paces of every contact for one never measured. A timeout of a request that
moved a value doubles that contact's allowance for its retry (up to ``MAX_BACKOFF`` x), as
``rtt.py`` doubles small requests' timeouts, or multiplies it by ``UNMEASURED_BACKOFF`` if
the contact was never measured; an answer ends the backoff, and fast answers bring the
estimate down within ``WINDOW`` of them.

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
>>> on_10mbs = Store(4, KadId(1), KadId(7), bytes(200_000_000), ttl_s=60.0)
>>> round(sizes.wait_s(config, on_10mbs, None, node_id=5), 3)
2.1
>>> sizes.pace.answered(5, 4, 0, 20.0)     # it took 20 s: 0.1 s per MB, a 10 MB/s link
>>> round(sizes.wait_s(config, store, None, node_id=5), 3)    # 0.1 + 200 x 2 x 0.1
40.1
"""
from __future__ import annotations

from collections import deque

from .events import KademliaConfig
from .ids import KadId
from .messages import Call, FindValue, Kind, Message, Reply, Store, Value
from .storage import Storage

#: the unit of ``rpc_timeout_s_per_mb``
MB = 1_000_000
#: requests whose answer may bring a value back
BRINGS_VALUE = frozenset({Kind.FIND_VALUE, Kind.CALL})
#: a round trip that moved less is mostly latency: it says nothing of the link's pace
MIN_SAMPLE_BYTES = MB
#: how many of a contact's last paces its estimate keeps (the slowest counts); the pooled
#: estimate keeps twice as many, over every contact
WINDOW = 4
#: the wait per MB over the slowest recent pace: a link shared with one more transfer than
#: when measured (a writer's STOREs to two holders at once, a CALL's answer while a round's
#: STOREs go out), or the pace halved by other traffic, is still waited for
MARGIN = 2.0
#: the most a contact's allowance grows after timeouts (32 x)
MAX_BACKOFF = 32
#: how much the first miss of a contact never measured grows it: its pace was a guess (the
#: default or others' paces), not a measurement, so its retry (whose deadline the first
#: try's answer is taken until, too) allows for a link up to ~8 x slower than guessed
UNMEASURED_BACKOFF = 8


class ValueSizes:
    """The size of the last value seen per key (at most ``max_keys``, least recent dropped).

    Args:
        max_keys: how many keys' sizes are kept.
    """

    def __init__(self, max_keys: int = 4096) -> None:
        self.max_keys = max_keys
        self._sizes: dict[int, int] = {}
        self.pace = LinkPace(max_keys)

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
               retry: bool = False, node_id: int | None = None) -> float:
        """How long to wait for the answer to ``message`` (a STORE, FIND_VALUE or CALL
        about to be sent to ``node_id``; its value's size is noted). ``retry``: it is sent
        again after a timeout (a read of a size never seen then allows for
        ``max_value_bytes``). ``node_id`` None: the configured allowance alone, unmeasured."""
        nbytes = sent = 0
        if isinstance(message, (Store, Call)) and message.value is not None:
            nbytes = sent = message.value.nbytes
            self.note(message.key, nbytes)
        if isinstance(message, (FindValue, Call)):
            back = self.expected(message.key, storage)
            nbytes += (config.max_value_bytes if retry else 0) if back is None else back
        if node_id is None or not config.rpc_timeout_s_per_mb:   # 0: the fixed wait
            return config.rpc_timeout_s + config.rpc_timeout_s_per_mb * nbytes / MB
        self.pace.sent(message.rpc_id, sent, nbytes)
        self.pace.moved(node_id, sent)
        per_mb = self.pace.per_mb(node_id, config.rpc_timeout_s_per_mb)
        return config.rpc_timeout_s + per_mb * nbytes / MB

    def behind_s(self, config: KademliaConfig, node_id: int) -> float:
        """``LinkPace.behind_s`` at the configured floor (0 without a per-MB allowance)."""
        return self.pace.behind_s(node_id, config.rpc_timeout_s_per_mb) \
            if config.rpc_timeout_s_per_mb else 0.0

    def answered(self, key: int, node_id: int, message: Message, rtt_s: float) -> None:
        """``message`` from ``node_id`` answers our request about ``key`` sent ``rtt_s``
        ago: the value it brings is noted, and the round trip measured if it moved one."""
        back = 0
        if isinstance(message, (Value, Reply)) and message.value is not None:
            back = message.value.nbytes
            self.note(key, back)
            self.pace.moved(node_id, back)
        self.pace.answered(node_id, message.rpc_id, back, rtt_s)


class LinkPace:
    """Seconds per MB that value requests to each contact took (at most ``max_contacts``
    contacts and as many requests in flight, least recent dropped).

    Args:
        max_contacts: how many contacts' paces, and requests' sizes, are kept.
    """

    def __init__(self, max_contacts: int = 4096) -> None:
        self.max_contacts = max_contacts
        self._peers: dict[int, tuple[deque[float], list[int]]] = {}  # id -> paces, [backoff]
        self._pooled: deque[float] = deque(maxlen=2 * WINDOW)
        self._moving: dict[int, tuple[int, int]] = {}   # rpc id -> (bytes sent, expected)
        self._largest: dict[int, int] = {}   # id -> the largest value moved with it, either way

    def _entry(self, node_id: int) -> tuple[deque[float], list[int]]:
        entry = self._peers.pop(node_id, None)
        if entry is None:
            entry = (deque(maxlen=WINDOW), [1])
            if len(self._peers) >= self.max_contacts:
                del self._peers[next(iter(self._peers))]
        self._peers[node_id] = entry            # most recent last
        return entry

    def sent(self, rpc_id: int, nbytes: int, expected: int) -> None:
        """Request ``rpc_id`` carries ``nbytes`` and moves ``expected`` bytes in all."""
        if len(self._moving) >= self.max_contacts:
            del self._moving[next(iter(self._moving))]
        self._moving[rpc_id] = (nbytes, expected)

    def answered(self, node_id: int, rpc_id: int, back: int, rtt_s: float) -> None:
        """Request ``rpc_id`` to ``node_id`` was answered with ``back`` bytes of value after
        ``rtt_s``: its pace is measured if it moved ``MIN_SAMPLE_BYTES``; no more doubling."""
        moved = self._moving.pop(rpc_id, None)
        if moved is None:
            return
        paces, backoff = self._entry(node_id)
        backoff[0] = 1
        nbytes = moved[0] + back
        if nbytes >= MIN_SAMPLE_BYTES:
            pace = max(0.0, rtt_s) * MB / nbytes
            paces.append(pace)
            self._pooled.append(pace)

    def timed_out(self, node_id: int, rpc_id: int) -> None:
        """Request ``rpc_id`` to ``node_id`` timed out: if it moved a value, double the
        contact's allowance for its retry (until an answer)."""
        moved = self._moving.get(rpc_id)
        if moved is not None and moved[1] > 0:
            paces, backoff = self._entry(node_id)
            backoff[0] = min(backoff[0] * (2 if paces else UNMEASURED_BACKOFF), MAX_BACKOFF)

    def moved(self, node_id: int, nbytes: int) -> None:
        """A value of ``nbytes`` went to ``node_id`` or came from it (a request, an answer)."""
        if nbytes >= MIN_SAMPLE_BYTES and nbytes > self._largest.get(node_id, 0):
            if len(self._largest) >= self.max_contacts:
                del self._largest[next(iter(self._largest))]
            self._largest[node_id] = nbytes

    def behind_s(self, node_id: int, floor: float) -> float:
        """How long a small message to ``node_id``, or its answer, may wait behind a value on
        the same connection (one TCP connection each way): the largest value moved with it
        at the pace allowed per MB (without a timeout's backoff); 0 if none of
        ``MIN_SAMPLE_BYTES`` moved. A PING queued behind a 16 MB STORE on a 100 Mb/s link
        is answered 1.3 s later, alive: it must not be taken for a dead peer's."""
        nbytes = self._largest.get(node_id, 0)
        if not nbytes:
            return 0.0
        entry = self._peers.get(node_id)
        paces = entry[0] if entry is not None and entry[0] else self._pooled
        if not paces:       # never measured (an owner answers, it asks little): a guess
            return floor * UNMEASURED_BACKOFF * MARGIN * nbytes / MB
        return max(floor, MARGIN * max(paces)) * nbytes / MB

    def per_mb(self, node_id: int, floor: float) -> float:
        """The seconds per MB to allow a request to ``node_id`` (``floor``: the least)."""
        entry = self._peers.get(node_id)
        paces = entry[0] if entry is not None and entry[0] else self._pooled
        backoff = entry[1][0] if entry is not None else 1
        return max(floor, MARGIN * max(paces, default=0.0)) * backoff

"""Adaptive RPC timeouts: a smoothed round-trip estimate per contact (pure arithmetic).

The rule is the familiar retransmission timer's (RFC 6298): each reply's round trip ``r``,
measured on the node's own clock from request to reply, updates ``rttvar <- 3/4 rttvar +
1/4 |srtt - r|`` then ``srtt <- 7/8 srtt + 1/8 r`` (the first sample sets ``srtt = r``,
``rttvar = r / 2``). A request then times out after ``clamp(srtt + 4 rttvar, low, high)``,
doubled for each timeout the contact has had since its last reply (backoff), never past
``high``. A contact never measured gets the same rule from one estimate pooled over every
reply (``high`` itself until the first reply).

>>> est = RttEstimator(low=0.05, high=2.0)
>>> est.timeout(7)                        # nothing measured yet
2.0
>>> est.observe(7, 0.001); est.timeout(7), est.timeout(8)   # tiny RTTs: the floor
(0.05, 0.05)
>>> est.backoff(7); est.timeout(7)       # a timeout doubles the next one
0.1
>>> est.observe(7, 0.3); round(est.timeout(7), 3)   # a reply resets the backoff
0.339
"""
from __future__ import annotations

from .messages import Kind

#: requests timed out adaptively: small, answered at once by the node, with small answers.
#: STORE, FIND_VALUE and CALL move values of any size (and a CALL waits on its engine), so
#: they wait ``rpc_timeout_s`` plus an allowance for the size of their values (``sizes.py``).
ADAPTIVE_KINDS = frozenset({Kind.PING, Kind.FIND_NODE})
#: requests whose late answer may stand in for their retry's (reads: asking twice changes
#: nothing at the peer)
READ_KINDS = frozenset({Kind.PING, Kind.FIND_NODE, Kind.FIND_VALUE})
#: the most doublings kept (the timeout is capped at ``high`` long before in practice)
MAX_BACKOFF = 1 << 10


class RttEstimator:
    """Smoothed round trips per contact (at most ``max_contacts``, least recent dropped).

    Args:
        low: the smallest timeout handed out (``KademliaConfig.min_rpc_timeout_s``).
        high: the largest, and the timeout before any reply was measured
            (``KademliaConfig.rpc_timeout_s``).
        max_contacts: how many contacts' estimates are kept.
    """

    def __init__(self, low: float, high: float, max_contacts: int = 4096) -> None:
        self.low = min(low, high)
        self.high = high
        self.max_contacts = max_contacts
        self._peers: dict[int, list[float]] = {}   # id -> [srtt, rttvar, backoff]; srtt < 0:
        #                                              not measured (a backoff only)
        self._pooled: list[float] | None = None    # [srtt, rttvar] over every reply

    @staticmethod
    def _update(est: list[float], rtt: float) -> None:
        if est[0] < 0:
            est[0], est[1] = rtt, rtt / 2
        else:
            est[1] = 0.75 * est[1] + 0.25 * abs(est[0] - rtt)
            est[0] = 0.875 * est[0] + 0.125 * rtt

    def _entry(self, node_id: int) -> list[float]:
        est = self._peers.pop(node_id, None)
        if est is None:
            est = [-1.0, 0.0, 1.0]
            if len(self._peers) >= self.max_contacts:
                del self._peers[next(iter(self._peers))]
        self._peers[node_id] = est           # most recent last
        return est

    def observe(self, node_id: int, rtt: float) -> None:
        """A reply from ``node_id`` came ``rtt`` seconds after its request."""
        rtt = max(0.0, rtt)
        est = self._entry(node_id)
        self._update(est, rtt)
        est[2] = 1.0
        if self._pooled is None:
            self._pooled = [rtt, rtt / 2]
        else:
            self._update(self._pooled, rtt)

    def backoff(self, node_id: int) -> None:
        """A request to ``node_id`` timed out: double its next timeout (until a reply)."""
        est = self._entry(node_id)
        est[2] = min(est[2] * 2, MAX_BACKOFF)

    def forget(self, node_id: int) -> None:
        """Drop what is known of ``node_id`` (evicted: it is measured afresh if it returns)."""
        self._peers.pop(node_id, None)

    def srtt(self, node_id: int) -> float | None:
        """The smoothed round trip of ``node_id`` (None: never measured)."""
        est = self._peers.get(node_id)
        return None if est is None or est[0] < 0 else est[0]

    def timeout(self, node_id: int) -> float:
        """How long to wait for ``node_id``'s reply to a request sent now."""
        est = self._peers.get(node_id)
        backoff = 1.0 if est is None else est[2]
        if est is not None and est[0] >= 0:
            base = est[0] + 4 * est[1]
        elif self._pooled is not None:
            base = self._pooled[0] + 4 * self._pooled[1]
        else:
            return self.high
        return min(self.high, max(self.low, base) * backoff)

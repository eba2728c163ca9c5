"""Requests that move large values (``sizes.py``): a STORE, FIND_VALUE or CALL waits
``rpc_timeout_s`` plus an allowance per MB of the value it carries and of the one its answer
may bring, so a live peer on a link that takes longer than ``rpc_timeout_s`` to move a
value is neither given up on nor evicted; small requests keep ``rpc_timeout_s``."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from engines.peer.kademlia.events import KademliaConfig
from engines.peer.kademlia.ids import KadId
from engines.peer.kademlia.messages import Call, FindValue, Store
from engines.peer.kademlia.node import KademliaNode
from engines.peer.kademlia.sim import SimNetwork
from engines.peer.kademlia.sizes import MAX_BACKOFF, MB, LinkPace, ValueSizes
from engines.peer.kademlia.values import Blob
from tests.peer.paced import PacedLink

# the training overlay's 0.1 s timeout (engines/peer/job.py), replication 3
CONFIG = KademliaConfig(rpc_timeout_s=0.1, replication=3, refresh_on_join=False,
                        refresh_interval_s=1e9, republish_interval_s=1e9)
LINK_BYTES_PER_S = 100 * MB          # every peer's uplink: 0.2 s for the 20 MB value
SLOW_BYTES_PER_S = 10 * MB          # 2 s for the 20 MB value, 5 x slower than the default
VALUE = np.arange(5 * MB, dtype=np.float32)      # 20 MB


def kept_after_every_deadline(net: SimNetwork, node: KademliaNode, holders: list[str]) -> None:
    """Once every deadline passed, ``node`` still has each of ``holders`` in its table, none
    given up on."""
    net.run_for(30.0)
    for holder in holders:
        holder_id = net.nodes[holder].node_id
        assert holder_id in node.routing
        assert not node.is_gone(holder_id, net.clock.now())


def paced_net(config: KademliaConfig, seed: int, rate: float = LINK_BYTES_PER_S) -> SimNetwork:
    net = SimNetwork(config, seed=seed, latency_s=(0.010, 0.012))
    net.grow(30)
    for address in net.nodes:
        net.attach(address, PacedLink(net, address, net.nodes[address], rate))
    return net


def stored(net: SimNetwork, writer: str, key: KadId) -> tuple[Any, list[str]]:
    """Set VALUE under ``key`` from ``writer``: (its Done, the other holders' addresses)."""
    done = net.run_op(writer, lambda n, now: n.set(key, VALUE, now))
    return done, [c.address for c in done.stored_on if c.address != writer]


def reader_of(net: SimNetwork, key: KadId) -> str:
    """A peer that holds no copy of ``key`` (and never saw its value)."""
    holders = {c.address for c in net.true_closest(key, CONFIG.copies)}
    return next(a for a in sorted(net.nodes, key=lambda a: int(a[1:])) if a not in holders)


class TestLargeValues:
    def test_a_large_value_is_stored_without_a_miss(self) -> None:
        net = paced_net(CONFIG, seed=81)
        key = KadId(net.nodes["n4"].node_id ^ 5)
        done, holders = stored(net, "n0", key)
        writer = net.nodes["n0"]
        # 20 MB take 0.2 s on the link, twice the 0.1 s timeout: its STOREs wait 0.1 s +
        # 20 x 0.02 s and are answered once
        assert done.durable and done.asked == len(holders) >= 2
        assert writer.stats.timeouts == 0 and net.rejected == 0
        assert all(net.nodes[h].node_id in writer.routing for h in holders)

    def test_a_peer_that_never_saw_a_large_value_reads_it_and_keeps_its_holders(self):
        net = paced_net(CONFIG, seed=83)
        key = KadId(net.nodes["n4"].node_id ^ 5)
        holders = [c.address for c in net.true_closest(key, CONFIG.copies)]
        for holder in holders:          # put there directly: only the read is tested
            net.nodes[holder].storage.put(key, Blob.of(VALUE), 0.0, 1e6, clock=3)
        address = reader_of(net, key)
        reader = net.nodes[address]
        # its first FIND_VALUE to a holder times out at 0.1 s (a read of a size never seen
        # waits as a small one), the retry allows for max_value_bytes, and the first try's
        # answer, late, is taken: the value is read
        got = net.get(address, key)
        np.testing.assert_array_equal(got.value, VALUE)
        assert got.clock == 3 and reader.stats.late_replies >= 1 and net.rejected == 0
        kept_after_every_deadline(net, reader, holders)
        # the size is known now: a read of the newest copies misses nothing
        timeouts = reader.stats.timeouts
        again = net.get(address, key, newest=True)
        np.testing.assert_array_equal(again.value, VALUE)
        assert reader.stats.timeouts == timeouts and net.rejected == 0

    def test_without_the_allowance_the_holders_are_lost(self) -> None:
        """The old fixed timeout (``rpc_timeout_s_per_mb=0``): the same STORE times out
        twice per holder, each a live peer that gets evicted, and nothing is durable."""
        config = dataclasses.replace(CONFIG, rpc_timeout_s_per_mb=0.0)
        net = paced_net(config, seed=81)
        key = KadId(net.nodes["n4"].node_id ^ 5)
        done = net.run_op("n0", lambda n, now: n.set(key, VALUE, now))
        writer = net.nodes["n0"]
        assert not done.durable and done.asked >= 2
        assert writer.stats.timeouts >= 2 * done.asked       # each tried twice
        holders = [c for c in net.true_closest(key, 3) if c.address != "n0"]
        assert all(writer.is_gone(c.node_id, net.clock.now()) for c in holders)
        net.run_for(0.5)
        assert net.rejected >= 2 * done.asked   # their answers came too late to count

    def test_a_call_that_moves_a_large_value_each_way_is_answered(self) -> None:
        net = paced_net(CONFIG, seed=82)
        echo = net.nodes["n7"]
        echo.on_call = lambda sender, call, now, eff: (1, (), call.value)
        peer = net.contact("n7")
        key = KadId(99)
        done = net.run_op("n2", lambda n, now: n.call(peer, 5, key, now, value=VALUE))
        # 20 MB out, 20 MB back (0.2 s on n7's link): the CALL waits 0.1 s + 40 x 0.02 s
        assert done.reply is not None and done.reply.status == 1
        np.testing.assert_array_equal(done.reply.value.to_value(), VALUE)
        assert net.nodes["n2"].stats.timeouts == 0 and peer.node_id in net.nodes["n2"].routing


class TestSlowLinks:
    """Links of 10 MB/s, 5 x slower than the default allowance (0.02 s per MB) assumes: the
    allowance follows each contact's measured pace. Before, the same requests missed twice
    per contact and live holders were evicted."""

    def test_a_large_value_is_stored_with_one_miss_per_holder_at_most(self) -> None:
        net = paced_net(CONFIG, seed=81, rate=SLOW_BYTES_PER_S)
        key = KadId(net.nodes["n4"].node_id ^ 5)
        done, holders = stored(net, "n0", key)
        writer = net.nodes["n0"]
        # 2 s on the link; the first try waits 0.1 + 20 x 0.02 s and misses, its retry
        # allows 8 x as much per MB, and the first try's answer, late, counts
        assert done.durable and done.asked == len(holders) >= 2
        assert writer.stats.timeouts <= len(holders)
        kept_after_every_deadline(net, writer, holders)
        # measured now: the next STORE to them misses nothing
        timeouts = writer.stats.timeouts
        again = net.run_op("n0", lambda n, now: n.set(key, VALUE + 1, now))
        assert again.durable and writer.stats.timeouts == timeouts

    def test_a_call_that_moves_a_large_value_each_way_misses_once_at_most(self) -> None:
        net = paced_net(CONFIG, seed=82, rate=SLOW_BYTES_PER_S)
        echo = net.nodes["n7"]
        echo.on_call = lambda sender, call, now, eff: (1, (), call.value)
        peer = net.contact("n7")
        caller = net.nodes["n2"]
        for attempt in range(2):
            done = net.run_op("n2", lambda n, now: n.call(peer, 5, KadId(99), now, value=VALUE))
            assert done.reply is not None and done.reply.status == 1
            np.testing.assert_array_equal(done.reply.value.to_value(), VALUE)
            assert caller.stats.timeouts <= 1 and peer.node_id in caller.routing
        net.run_for(30.0)
        assert peer.node_id in caller.routing
        assert not caller.is_gone(peer.node_id, net.clock.now())

    def test_the_allowance_doubles_per_miss_capped_and_comes_back_down(self) -> None:
        pace = LinkPace()
        floor = CONFIG.rpc_timeout_s_per_mb
        assert pace.per_mb(1, floor) == floor               # nothing measured: the default
        pace.sent(10, 20 * MB, 20 * MB)
        pace.answered(1, 10, 0, 2.0)                        # 20 MB in 2 s: 0.1 s per MB
        assert pace.per_mb(1, floor) == pytest.approx(0.2)  # x 2 (MARGIN)
        assert pace.per_mb(2, floor) == pytest.approx(0.2)  # pooled for an unmeasured one
        for rpc in range(20, 30):                           # misses: x 2 each, capped
            pace.sent(rpc, 20 * MB, 20 * MB)
            pace.timed_out(1, rpc)
        assert pace.per_mb(1, floor) == pytest.approx(0.2 * MAX_BACKOFF)
        for rpc in range(30, 34):                           # fast answers: back to the floor
            pace.sent(rpc, 20 * MB, 20 * MB)
            pace.answered(1, rpc, 0, 0.1)
        assert pace.per_mb(1, floor) == floor
        pace.sent(40, 100, 100)                             # small: not measured
        pace.answered(1, 40, 0, 5.0)
        assert pace.per_mb(1, floor) == floor


class TestWaits:
    def test_small_requests_wait_rpc_timeout_s_and_large_ones_more(self) -> None:
        sizes = ValueSizes()
        small = Store(1, KadId(1), KadId(2), b"x" * 100, ttl_s=60.0)
        assert sizes.wait_s(CONFIG, small, None) == pytest.approx(0.1, abs=1e-5)
        read = FindValue(2, KadId(1), KadId(3))        # never seen: rpc_timeout_s
        assert sizes.wait_s(CONFIG, read, None) == 0.1
        assert sizes.wait_s(CONFIG, read, None, retry=True) == pytest.approx(
            0.1 + 0.02 * CONFIG.max_value_bytes / MB)
        big = Call(3, KadId(1), 1, KadId(4), (), Blob.of(bytes(10 * MB)))
        # 10 MB out, and as much expected back: 0.1 + 20 x 0.02
        assert sizes.wait_s(CONFIG, big, None) == pytest.approx(0.5)

    def test_the_copy_held_gives_the_size_and_sizes_are_bounded(self) -> None:
        node = KademliaNode(KadId(1), "a", CONFIG)
        node.set(KadId(9), bytes(5 * MB), now=0.0)
        sizes = ValueSizes(max_keys=2)
        assert sizes.expected(9, node.storage) == 5 * MB
        for key in (1, 2, 3):
            sizes.note(key, 10)
        assert sizes.expected(1, None) is None and sizes.expected(3, None) == 10


class TestBehindValues:
    """A small request waits behind the values on its connection (``LinkPace.behind_s``)."""

    def test_the_wait_follows_the_largest_value_moved_with_the_peer_and_its_pace(self):
        pace = LinkPace()
        assert pace.behind_s(5, 0.02) == 0.0                 # nothing moved with it
        pace.moved(5, MB // 2)
        assert pace.behind_s(5, 0.02) == 0.0                 # under 1 MB: latency, mostly
        pace.moved(5, 16 * MB)
        pace.moved(5, 4 * MB)                                # the largest counts
        # never measured: 8 x the floor, twice: 0.32 s per MB
        assert pace.behind_s(5, 0.02) == pytest.approx(16 * 0.02 * 8 * 2)
        pace.sent(1, 20 * MB, 20 * MB)
        pace.answered(5, 1, 0, 2.0)                          # 0.1 s per MB measured
        assert pace.behind_s(5, 0.02) == pytest.approx(16 * 0.1 * 2)
        assert pace.behind_s(6, 0.02) == 0.0                 # another peer: nothing moved

    def test_a_ping_queued_behind_a_large_value_keeps_its_live_peer(self) -> None:
        """n0 STOREs 20 MB on the two other peers over 10 MB/s, then PINGs one of them on
        the same connection: the PONG comes 2-4 s later, behind the value. The PING waited
        0.1 s (0.2 s for two tries) before, and the live peer was evicted."""
        net = SimNetwork(CONFIG, seed=3, latency_s=(0.001, 0.002))
        net.grow(3)
        links = {a: PacedLink(net, a, net.nodes[a], SLOW_BYTES_PER_S, queue_pair=True)
                 for a in net.nodes}
        for address, link in links.items():
            net.attach(address, link)
        node, other = net.nodes["n0"], net.contact("n1")
        links["n0"].start(lambda n, now: n.set(KadId(other.node_id ^ 1), VALUE, now))
        net.run_for(0.05)                         # its lookup is done, the STOREs go out
        assert links["n0"].pair_until["n1"] > net.clock.now() + 1.9
        done = links["n0"].run_op(lambda n, now: n.ping(other, now))
        assert done.contacts == (other,) and net.clock.now() > 1.9        # answered, late
        assert other.node_id in node.routing and not node.is_gone(other.node_id,
                                                                   net.clock.now())


@pytest.mark.parametrize("rate", [-0.01, math.nan, math.inf])
def test_a_negative_or_unbounded_allowance_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="rpc_timeout_s_per_mb"):
        KademliaConfig(rpc_timeout_s_per_mb=rate)

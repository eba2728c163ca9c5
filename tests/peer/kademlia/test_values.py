"""Arrays and tensors on the overlay, with versions: set from one peer, read from every other;
replicas keep the newest version whatever order updates arrive in."""
from __future__ import annotations

import random

import numpy as np
import pytest

from engines.peer.kademlia.events import KademliaConfig
from engines.peer.kademlia.ids import KadId, key_id
from engines.peer.kademlia.sim import SimNetwork
from engines.peer.kademlia.storage import MemoryStorage
from engines.peer.kademlia.values import MAX_STAMPS, Blob, parse

THREE = KademliaConfig(replication=3, refresh_on_join=False, refresh_interval_s=1e9)


def holders(net: SimNetwork, key: KadId) -> dict[str, int]:
    """Live address -> clock of the copy it holds."""
    now = net.clock.now()
    found = {a: net.nodes[a].storage.get(key, now) for a in net.alive}
    return {a: r.clock for a, r in found.items() if r is not None}


class TestValuesOnTheOverlay:
    def test_an_array_set_from_one_peer_is_read_from_every_other_over_the_wire(self) -> None:
        net = SimNetwork(THREE, seed=3, wire=True)
        live = net.grow(40)
        weights = np.random.default_rng(3).normal(size=(64, 8)).astype(np.float32)
        key = key_id("model/w")
        done = net.set(live[7], key, weights)
        assert done.clock == 0 and len(done.stored_on) == 3
        for address in live:
            got = net.get(address, key)
            assert got.clock == 0
            np.testing.assert_array_equal(got.value, weights)
            assert got.value.dtype == np.float32 and got.value.shape == (64, 8)

    def test_tensors_keep_their_dtype(self) -> None:
        torch = pytest.importorskip("torch")
        net = SimNetwork(THREE, seed=4, wire=True)
        live = net.grow(20)
        tensor = torch.linspace(0, 1, 30, dtype=torch.bfloat16).reshape(5, 6)
        net.set(live[0], key_id("t"), tensor)
        got = net.get(live[13], key_id("t")).value
        assert isinstance(got, torch.Tensor) and torch.equal(got, tensor)

    def test_each_set_bumps_the_clock_and_readers_see_the_newest(self) -> None:
        net = SimNetwork(THREE, seed=5)
        live = net.grow(30)
        key = key_id("w")
        for version in range(4):
            done = net.set(live[2], key, np.full(3, float(version)))
            assert done.clock == version
        assert set(holders(net, key).values()) == {3}
        got = net.get(live[20], key)
        assert got.clock == 3 and got.value.tolist() == [3.0, 3.0, 3.0]

    def test_a_stale_store_does_not_overwrite_a_newer_copy(self) -> None:
        net = SimNetwork(THREE, seed=6)
        live = net.grow(30)
        key = key_id("w")
        net.set(live[0], key, b"new", clock=5)
        net.set(live[1], key, b"old", clock=2)            # a late writer with an older clock
        held = holders(net, key)
        assert all(held[c.address] == 5 for c in net.true_closest(key, 3))
        assert all(net.get(a, key).value == b"new" for a in live[::5])

    def test_equal_clocks_are_broken_by_writer_id_everywhere(self) -> None:
        store = MemoryStorage()
        a, b = KadId(10), KadId(20)
        assert store.put(KadId(1), Blob.of(b"a"), 0.0, 60.0, clock=1, writer=a)
        assert store.put(KadId(1), Blob.of(b"b"), 0.0, 60.0, clock=1, writer=b)
        assert not store.put(KadId(1), Blob.of(b"a"), 0.0, 60.0, clock=1, writer=a)
        record = store.get(KadId(1), 1.0)
        assert record is not None and record.value.to_value() == b"b"

    def test_an_owner_writing_again_skips_the_lookup(self) -> None:
        config = KademliaConfig(replication=3, refresh_on_join=False, holders_cache_s=30.0)
        net = SimNetwork(config, seed=7)
        live = net.grow(60)
        key = key_id("w")
        first = net.set(live[0], key, np.zeros(4))
        again = net.set(live[0], key, np.ones(4))
        assert first.rpcs > 3 and again.rpcs == len(again.stored_on) - (net.contact(live[0])
                                                                          in again.stored_on)
        assert {c.address for c in again.stored_on} == {c.address for c in first.stored_on}
        assert net.get(live[30], key).value.tolist() == [1.0] * 4

    def test_oversize_and_unsupported_values_are_refused_on_set(self) -> None:
        net = SimNetwork(KademliaConfig(max_value_bytes=100, refresh_on_join=False), seed=8)
        live = net.grow(5)
        node = net.nodes[live[0]]
        with pytest.raises(ValueError, match="max_value_bytes"):
            node.set(key_id("big"), np.zeros(100), now=0.0)
        with pytest.raises(TypeError, match="numpy arrays"):
            node.set(key_id("obj"), {"a": 1}, now=0.0)
        with pytest.raises(TypeError, match="numeric"):
            node.set(key_id("obj"), np.array([object()]), now=0.0)
        assert node.storage.keys() == []


class TestFuzzedValueStores:
    def test_random_update_orders_converge_to_the_highest_version(self) -> None:
        rng = random.Random(11)
        for _ in range(50):
            store = MemoryStorage()
            versions = [(rng.randrange(5), KadId(rng.randrange(1, 4))) for _ in range(8)]
            for clock, writer in versions:
                store.put(KadId(1), Blob.of(f"{clock}/{writer}".encode()), 0.0, 60.0,
                          clock=clock, writer=writer)
            best = max(versions)
            record = store.get(KadId(1), 1.0)
            assert record is not None and record.version == best
            assert record.value.to_value() == f"{best[0]}/{best[1]}".encode()



class TestBlobShapes:
    @pytest.mark.parametrize("value", [np.array(2.5), np.asfortranarray(np.ones((3, 4))),
                                       np.arange(16.0).reshape(4, 4)[:, ::2], np.zeros((2, 0))],
                             ids=["0-d", "fortran", "strided", "empty"])
    def test_a_value_comes_back_with_its_shape_and_contents(self, value: np.ndarray) -> None:
        # a 0-d array came back of shape (1,): np.ascontiguousarray makes it 1-d
        got = Blob.of(value).to_value()
        assert got.shape == value.shape and got.dtype == value.dtype
        np.testing.assert_array_equal(got, value)


class TestStamps:
    """An engine's (id, step) stamps go wherever the value goes (``Blob.stamps``)."""

    def test_stamped_shares_the_buffer_and_the_descriptor_carries_the_stamps(self) -> None:
        blob = Blob.of(np.arange(4, dtype=np.float32))
        stamped = blob.stamped(((KadId(9), 3), (KadId(2), 0)))
        assert stamped.data.obj is blob.data.obj and blob.stamps == ()
        assert stamped != blob and stamped.stamped(()) == blob
        got = parse(stamped.descriptor(), bytes(stamped.data), max_bytes=100)
        assert got == stamped and got.stamps == ((KadId(9), 3), (KadId(2), 0))
        assert len(blob.descriptor()) == 3          # none: the descriptor as before

    def test_more_stamps_than_the_limit_are_refused_on_both_sides(self) -> None:
        many = tuple((KadId(i), 1) for i in range(MAX_STAMPS + 1))
        with pytest.raises(ValueError, match="over the limit"):
            Blob.of(b"x").stamped(many)
        assert len(Blob.of(b"x").stamped(many[:-1]).stamps) == MAX_STAMPS

    def test_replicas_keep_the_stamps_of_the_version_they_hold(self) -> None:
        net = SimNetwork(THREE, seed=4, wire=True)
        live = net.grow(12)
        key = key_id("k")
        net.set(live[0], key, Blob.of(np.ones(2)).stamped(((KadId(5), 8),)))
        for address in live:
            held = net.nodes[address].storage.get(key, net.clock.now())
            assert held is None or held.value.stamps == ((KadId(5), 8),)
        assert sum(net.nodes[a].storage.get(key, net.clock.now()) is not None
                   for a in live) >= 3              # the 3 closest (and the setter)

"""Shared simulated overlays. Session-scoped and read-only: tests that kill nodes or advance
time past timers build their own network."""
from __future__ import annotations

import pytest

from engines.peer.kademlia.events import KademliaConfig
from engines.peer.kademlia.sim import SimNetwork

# Bucket refresh after each join multiplies join cost by ~5; the periodic refresh does the same
# job in a long-lived overlay, and lookups stay exact without it (see test_lookup).
FAST = KademliaConfig(refresh_on_join=False)


def grown(n: int, seed: int, config: KademliaConfig = FAST) -> SimNetwork:
    net = SimNetwork(config, seed=seed)
    net.grow(n)
    return net


@pytest.fixture(scope="session")
def net100() -> SimNetwork:
    return grown(100, seed=100)


@pytest.fixture(scope="session")
def net200() -> SimNetwork:
    return grown(200, seed=200)


@pytest.fixture(scope="session")
def net1000() -> SimNetwork:
    return grown(1000, seed=1000)

"""Fixtures of the core tests: ``pair``, two in-process nodes with service hosts (a test
file may define its own ``pair``, as test_requests.py does: that one wins there)."""
from __future__ import annotations

import shutil

import pytest

from actorpy.config import Config
from actorpy.runtime.host import ServiceHost
from actorpy.runtime.node import Node
from actorpy.wire.auth import Security, private_dir
from tests.core.service_pair import A, B, Side


@pytest.fixture
def pair(request):
    """Nodes a and b, each hosting at most 3 services whose inboxes hold ``request.param``
    messages (default 1000)."""
    folder = private_dir()
    sides = []
    for name in (A, B):
        node = Node(name, f"ipc://{folder}/{name}", Security.ipc(), linger_ms=0)
        config = Config(service_inbox_items=getattr(request, "param", 1000))
        sides.append(Side(node, ServiceHost(node, config, names=False, max_services=3)))
    a, b = sides
    for side in sides:
        side.node.start()
    a.node.add_peer(B, b.node.address, "worker")
    b.node.add_peer(A, a.node.address, "driver")
    yield a, b
    for side in sides:
        side.services.close()
        side.node.close()
    shutil.rmtree(folder, ignore_errors=True)

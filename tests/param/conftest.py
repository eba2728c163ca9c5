"""The 2-worker embedded cluster the PS engine's tests share within a module (one with
another layout defines its own ``cluster``)."""
from __future__ import annotations

import pytest

import actorpy


@pytest.fixture(scope="module")
def cluster():
    with actorpy.connect(workers=2) as c:
        yield c

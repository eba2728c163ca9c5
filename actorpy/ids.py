"""Typed identifiers. Ids are minted from an injected rng, never from ambient randomness."""
from __future__ import annotations

import random
from typing import NewType

NodeId = NewType("NodeId", str)
JobId = NewType("JobId", str)
TaskId = NewType("TaskId", int)

NODE_ID_BYTES = 16


def new_node_id(rng: random.Random, prefix: str = "n") -> NodeId:
    """Mint a node id: a short role prefix plus 12 hex digits from ``rng``.

    >>> new_node_id(random.Random(1), "w")
    'w-91b72265b1f5'
    """
    return NodeId(f"{prefix}-{rng.getrandbits(48):012x}")


def new_job_id(rng: random.Random, name: str = "job") -> JobId:
    """Mint a job id from a human name and 8 hex digits from ``rng``."""
    return JobId(f"{name}-{rng.getrandbits(32):08x}")

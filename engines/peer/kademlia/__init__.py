"""Kademlia overlay core for the P2P engine: pure, deterministic, sans-I/O.

Files:
    ids.py       160-bit ids (KadId), key_id (SHA-1), random_id, XOR distance, shared prefix
    routing.py   Contact, KBucket, RoutingTable: LRS k-buckets, replacement cache, closest()
    values.py    Blob: bytes / numpy arrays / tensors as a descriptor plus one out-of-band buffer
    messages.py  Kind (IntEnum) and one dataclass per message; every message carries a step
    rpc.py       strict encode/decode to plain values, value_frames (the buffers to send)
    lookup.py    Lookup: the iterative lookup state machine (alpha in flight, k closest)
    storage.py   Storage protocol, MemoryStorage: versions (clock, writer), TTL, republish
    steps.py     StepTable: the last step each peer reported on its messages
    services.py  size estimates from id density; the sampling depth
    sampling.py  uniform peer samples and overlay enumeration from cached complete subtrees
    events.py    KademliaConfig and what a node returns: Effects (Send, SetTimer, Done)
    rtt.py       adaptive timeouts of PING / FIND_NODE from measured round trips
    sizes.py     the wait of STORE / FIND_VALUE / CALL: an allowance per MB of their values
    ops.py       requests, retries, lookups, the STORE phase, liveness (under node.py)
    window.py    requests in flight per contact, capped (the rest queued); busy contacts
    node.py      KademliaNode: messages and timers in, Effects out (the protocol)
    upkeep.py    republish, re-replication when a holder dies, hand-off on graceful leave
    sim.py       SimNetwork: N nodes in memory on a virtual clock, seeded latency/loss/failures

A shell feeds ``node.receive(sender_address, message, now, frames)`` and
``node.on_timer(kind, token, now)`` and performs the returned ``Effects``; see
``docs/kademlia.md``.
"""
from __future__ import annotations

from .events import Done, Effects, KademliaConfig, OpKind, Send, SetTimer, TimerKind
from .ids import KadId, distance, key_id, random_id, shared_prefix_len
from .messages import Call, Kind, Reply
from .node import KademliaNode
from .routing import Contact, RoutingTable
from .rpc import decode, encode, value_frames
from .sim import SimNetwork
from .values import Blob

__all__ = [
    "Blob", "Call", "Contact", "Done", "Effects", "KadId", "KademliaConfig", "KademliaNode",
    "Kind", "OpKind", "Reply", "RoutingTable", "Send", "SetTimer", "SimNetwork", "TimerKind",
    "decode", "distance", "encode", "key_id", "random_id", "shared_prefix_len", "value_frames",
]

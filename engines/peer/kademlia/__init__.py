"""Kademlia overlay core for the P2P engine: pure, deterministic, sans-I/O.

Files:
    ids.py       160-bit ids (KadId), key_id (SHA-1), random_id, XOR distance, shared prefix
    routing.py   Contact, KBucket, RoutingTable: LRS k-buckets, replacement cache, closest()
    rpc.py       Kind (IntEnum), typed messages, strict encode/decode to plain values
    lookup.py    Lookup: the iterative lookup state machine (alpha in flight, k closest)
    storage.py   Storage protocol, MemoryStorage: TTL expiry and republish bookkeeping
    services.py  size estimates from id density; unbiased peer-sampling arithmetic
    events.py    KademliaConfig and what a node returns: Effects (Send, SetTimer, Done)
    node.py      KademliaNode: messages and timers in, Effects out (the protocol)
    sim.py       SimNetwork: N nodes in memory on a virtual clock, seeded latency/loss/failures

A shell feeds ``node.receive(sender_address, message, now)`` and
``node.on_timer(kind, token, now)`` and performs the returned ``Effects``; see
``docs/kademlia.md``.
"""
from __future__ import annotations

from .events import Done, Effects, KademliaConfig, OpKind, Send, SetTimer, TimerKind
from .ids import KadId, distance, key_id, random_id, shared_prefix_len
from .node import KademliaNode
from .routing import Contact, RoutingTable
from .rpc import Kind, decode, encode
from .sim import SimNetwork

__all__ = [
    "Contact", "Done", "Effects", "KadId", "KademliaConfig", "KademliaNode", "Kind", "OpKind",
    "RoutingTable", "Send", "SetTimer", "SimNetwork", "TimerKind", "decode", "distance",
    "encode", "key_id", "random_id", "shared_prefix_len",
]

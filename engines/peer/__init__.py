"""Peer-to-peer engine.

Files:
    kademlia/   the Kademlia overlay's pure protocol core: ids, routing table, messages and
                codec, lookup state machine, storage, size estimate and peer sampling, the
                sans-I/O node, and an in-memory simulator (see kademlia/__init__.py)
"""

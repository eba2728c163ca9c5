"""Peer-to-peer engine.

Files:
    kademlia/   the Kademlia overlay's pure protocol core (routing, lookups, storage, simulator)
"""

"""Kademlia routing core (sans-I/O)."""

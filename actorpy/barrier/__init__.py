"""Barrier control shared by every engine (pure: no sockets, no wall clock)."""

"""Map-reduce engine (not built yet)."""

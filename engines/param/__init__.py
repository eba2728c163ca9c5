"""Parameter-server engine (not built yet)."""

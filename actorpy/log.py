"""Logging helpers. The library never installs handlers; only the CLI configures logging."""
from __future__ import annotations

import logging
import os


def get_logger(name: str, node_id: str | None = None) -> logging.LoggerAdapter | logging.Logger:
    """The module logger, stamped with ``node_id`` when given."""
    logger = logging.getLogger(name)
    if node_id is None:
        return logger
    return logging.LoggerAdapter(logger, {"node_id": node_id})


def configure(level: str | None = None) -> None:
    """Configure the root logger for a CLI process (the only caller). ``level`` beats
    ``ACTORPY_LOG_LEVEL``, which beats WARNING."""
    chosen = (level or os.environ.get("ACTORPY_LOG_LEVEL") or "WARNING").upper()
    if not isinstance(logging.getLevelName(chosen), int):
        chosen = "WARNING"
    logging.basicConfig(
        level=chosen,
        format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s",
    )

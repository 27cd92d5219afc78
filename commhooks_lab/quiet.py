"""Hush one logger for a block: PyTorch logs notes the lab expects, and a notebook should not show them."""

from __future__ import annotations

import contextlib
import logging


@contextlib.contextmanager
def quiet_logger(name: str, level: int = logging.ERROR):
    """Raise logger ``name`` to ``level`` for the block (errors still show), then put its level back."""
    logger = logging.getLogger(name)
    saved = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(saved)

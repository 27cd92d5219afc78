"""Two small helpers every layer may use: hush a logger PyTorch fills with notes the lab expects, and resolve
``"module:function"`` strings (hooks and model factories named on a command line)."""

from __future__ import annotations

import contextlib
import importlib
import logging
from typing import Any

__all__ = ["import_object", "quiet_logger"]


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


def import_object(spec: str, what: str) -> Any:
    """Import ``attr`` from ``module`` for ``"module:attr"``; a ValueError naming ``what`` if that fails."""
    module_name, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {what} {spec}: {exc}") from exc

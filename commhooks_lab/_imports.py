"""Resolve ``"module:function"`` strings, so hooks and model factories can be named on a command line."""

from __future__ import annotations

import importlib
from typing import Any


def import_object(spec: str, what: str) -> Any:
    """Import ``attr`` from ``module`` for ``"module:attr"``; a ValueError naming ``what`` if that fails."""
    module_name, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {what} {spec}: {exc}") from exc

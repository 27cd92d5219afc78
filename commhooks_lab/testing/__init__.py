"""Regression-test your own notebooks and hooks the way this package tests its own.

- Notebooks, strict: ``pytest --nbval --nbval-current-env --nbval-sanitize-with <sanitize_file()>``
  (:func:`nbval_args`). With portable numerics (the default) the lab's outputs repeat bit for bit on any
  x86-64 CPU with AVX2 and the same torch build.
- Notebooks, tolerant: add ``--lab-tolerant`` (this package's pytest plugin, :mod:`.plugin`) where bits cannot
  repeat (another architecture or build, native numerics): numbers compare within the tolerances the notebook
  states in its metadata, integers and all other text exactly; a table says what moved and by how much.
- Hooks: :func:`assert_matches_golden` compares a :class:`~commhooks_lab.Result` with one saved earlier
  (``result.save(path)``): bytes exactly, per-step ``rel_error`` and loss within stated tolerances.
"""

from __future__ import annotations

import importlib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from .notebooks import CellReport, Tolerance, compare_notebooks, tolerance_of

if TYPE_CHECKING:
    from .golden import DEFAULT_RTOL, EXACT_COLUMNS, Moved, assert_matches_golden, compare_with_golden

#: Loaded on first use: :mod:`.golden` imports pandas (through Result), which nbval's pytest process, loading
#: only :mod:`.plugin`, never needs (a second of CPU on every nbval run).
_GOLDEN = ("DEFAULT_RTOL", "EXACT_COLUMNS", "Moved", "assert_matches_golden", "compare_with_golden")

__all__ = [
    "DEFAULT_RTOL",
    "EXACT_COLUMNS",
    "CellReport",
    "Moved",
    "Tolerance",
    "assert_matches_golden",
    "compare_notebooks",
    "compare_with_golden",
    "nbval_args",
    "sanitize_file",
    "tolerance_of",
]


def __getattr__(name: str):
    if name in _GOLDEN:
        return getattr(importlib.import_module(".golden", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def sanitize_file() -> Path:
    """The nbval sanitize rules this package's own notebooks use (addresses, pids, temp paths, figure sizes)."""
    return Path(str(resources.files("commhooks_lab") / "nbval_sanitize.cfg"))


def nbval_args(tolerant: bool = False) -> list[str]:
    """The pytest options for nbval with the lab's sanitize rules (strict, or ``tolerant``)."""
    args = ["-p", "commhooks_lab.testing.plugin", "--nbval", "--nbval-current-env"]
    args += ["--nbval-sanitize-with", str(sanitize_file())]
    return args + ["--lab-tolerant"] if tolerant else args

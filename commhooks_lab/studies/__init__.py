"""Studies that answer one question each, built on the notebook API: convergence over seeds and the headroom
test (``convergence``), bytes and time by rule (``network``), precision at scale (``precision``), mixed
precision with hooks (``mixed_precision``), the ``torch.compile`` matrix (``compile_matrix``), what runs here
(``availability``), overlap with backward (``overlap``), gradient accumulation (``accumulation``), syncing every
H steps (``low_communication``) and time behind real slow links (``links``), flat against hierarchical
communication on nodes behind slow uplinks (``nodes``); problems reported on PyTorch's and Accelerate's
trackers, broken and fixed (``reported_problems``); independent runs on several sets of ranks at once
(``side_by_side``).
May import everything below the plots and widgets; nothing below imports it.
"""

from __future__ import annotations

import importlib

#: ``lab.studies.convergence_study`` and friends, loaded on first use (importing a sibling loads nothing more).
_CONVERGENCE = ("convergence_study", "convergence_summary", "diverged", "headroom_study", "payoff_lineup", "power_sgd")
_MODULES = (
    "accumulation",
    "availability",
    "compile_matrix",
    "convergence",
    "links",
    "low_communication",
    "mixed_precision",
    "network",
    "nodes",
    "overlap",
    "precision",
    "reported_problems",
    "side_by_side",
)

__all__ = [*_CONVERGENCE, *_MODULES]


def __getattr__(name: str):
    if name in _CONVERGENCE:
        return getattr(importlib.import_module(".convergence", __name__), name)
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

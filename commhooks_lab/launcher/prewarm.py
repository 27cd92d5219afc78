"""What ``import commhooks_lab`` starts in a notebook kernel, so that the first run finds it ready.

The rank server imports torch and the rank code for the ranks; a background thread imports the
kernel's share of a run (torch for the rendezvous store, the engine, pandas for the Result) while
the learner reads the next cell. Neither happens in scripts (unless ``COMMHOOKS_LAB_PREWARM=1``),
in ranks, under torchrun, off Linux or with ``COMMHOOKS_LAB_PREWARM=0``
(:func:`commhooks_lab.launcher.rank_server.why_not_prewarm`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import threading

from . import rank_server

__all__ = ["start"]

#: What a run's ranks import: the rank server loads it once.
RANK_MODULES = ("numpy", "commhooks_lab.engine.dispatch")
#: What a run imports in the notebook's own process (torch, pandas and the engine come with it).
KERNEL_MODULES = ("commhooks_lab.experiment",)
#: At exit, wait this long for the background imports (a daemon thread stopped inside an import can crash).
JOIN_AT_EXIT_S = 30.0


def _import_all(modules: tuple[str, ...]) -> None:
    for name in modules:
        with contextlib.suppress(Exception):  # the real import, later, says what is wrong
            importlib.import_module(name)


def start() -> None:
    """Start the rank server and the background imports, where :func:`why_not_prewarm` allows."""
    rank_server.preload(*RANK_MODULES)
    if rank_server.prewarm() is None:
        return
    thread = threading.Thread(target=_import_all, args=(KERNEL_MODULES,), name="commhooks-prewarm", daemon=True)
    thread.start()
    atexit.register(thread.join, JOIN_AT_EXIT_S)

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
import threading
from collections.abc import Callable, Iterable

from . import rank_server

__all__ = ["start"]

#: At exit, wait this long for the background imports (a daemon thread stopped inside an import can crash).
JOIN_AT_EXIT_S = 30.0


def _quietly(imports: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):  # the real import, later, says what is wrong
        imports()


def start(rank_modules: Iterable[str] = (), kernel_imports: Callable[[], object] | None = None) -> None:
    """Start the rank server and the background imports, where :func:`why_not_prewarm` allows.

    The launcher knows nothing above it, so the package hands it what to load: ``rank_modules``, the modules a
    run's ranks import (the rank server loads them once, by name: it is another interpreter), and
    ``kernel_imports``, which imports a run's share in this process, on a background thread.
    """
    rank_server.preload(*rank_modules)
    if rank_server.prewarm() is None or kernel_imports is None:
        return
    thread = threading.Thread(target=_quietly, args=(kernel_imports,), name="commhooks-prewarm", daemon=True)
    thread.start()
    atexit.register(thread.join, JOIN_AT_EXIT_S)

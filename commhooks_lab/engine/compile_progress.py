"""Compiling counts as progress: while Dynamo compiles, a rank tells the notebook it is alive.

``timeout_s`` bounds a rank's silence (30 s by default). Compiling a step sends no heartbeat, and on a busy
machine compiling the first step of notebook 11's ``compiled_autograd`` run took more than 30 s: the run ended
in a ``WorkerTimeoutError`` although nothing hung. Dynamo calls its compile-start and compile-end callbacks
(``torch._dynamo.callback_handler``) around every compilation; between the two a thread sends this rank's
sign of life (``ctx.alive()``: it claims no step, so no rank is reported behind) every :data:`BEAT_S` seconds.
A hang outside compilation (a hook's collective that a rank never joins) stays silent and still times out.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["BEAT_S", "CompileProgress", "beating"]

#: How often a compiling rank says it is alive: well inside the default 30 s of silence.
BEAT_S = 5.0


class CompileProgress:
    """Whether Dynamo is compiling now (set and cleared by its callbacks)."""

    def __init__(self) -> None:
        self.compiling = threading.Event()


@contextlib.contextmanager
def beating(ctx: Any, every_s: float = BEAT_S) -> Iterator[CompileProgress]:
    """For the duration: a sign of life (``ctx.alive()``) every ``every_s`` s while Dynamo compiles, none otherwise."""
    import torch._dynamo

    progress = CompileProgress()
    handler = getattr(torch._dynamo, "callback_handler", None)
    if handler is None:  # a torch without compile callbacks: compiling stays silent, as before
        yield progress
        return
    stop = threading.Event()

    def started(args: Any) -> None:
        progress.compiling.set()

    def ended(args: Any) -> None:
        progress.compiling.clear()

    def beat() -> None:
        while not stop.wait(every_s):
            if progress.compiling.is_set():
                ctx.alive()

    handler.register_start_callback(started)
    handler.register_end_callback(ended)
    thread = threading.Thread(target=beat, name="commhooks-compile-beat", daemon=True)
    thread.start()
    try:
        yield progress
    finally:
        stop.set()
        thread.join()
        with contextlib.suppress(ValueError):  # torch._dynamo.reset() clears every callback
            handler.remove_start_callback(started)
            handler.remove_end_callback(ended)

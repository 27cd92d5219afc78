"""The errors a learner meets, each saying which rank failed, how, and what it printed."""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass

__all__ = ["explain_death", "OtherRankFailed", "RankFailure", "WorkerError", "WorkerTimeoutError"]


class OtherRankFailed(RuntimeError):
    """Raised by a rank that stops because another rank failed first: the launcher reports the other one's error
    as the cause, this one after it."""


@dataclass
class RankFailure:
    """One rank's failure: it raised (with the worker's traceback), died, or never answered."""

    rank: int
    how: str  # "raised" | "died" | "timeout"
    summary: str
    traceback: str = ""
    stderr_tail: str = ""  # the last lines the rank wrote to stderr, for deaths without a traceback
    step: int | None = None  # for a hang: the step the other ranks waited at
    detail: str = ""  # what it means and what to do, shown for the root cause only
    collectives: dict | None = None  # the rank's collectives this step and the last (collective_log)


class WorkerError(RuntimeError):
    """A rank raised, died or hung; every child process is gone by the time you see this."""

    def __init__(self, failure: RankFailure, others: list[RankFailure] | None = None):
        self.failure = failure
        self.rank = failure.rank
        self.how = failure.how
        self.step = failure.step
        self.worker_traceback = failure.traceback
        self.stderr_tail = failure.stderr_tail
        self.others = list(others or [])
        text = f"rank {failure.rank} {failure.summary}"
        if failure.detail:
            text += f": {failure.detail}"
        if self.others:
            text += "\nalso: " + "; ".join(f"rank {o.rank} {o.summary}" for o in self.others)
        if failure.traceback:
            text += f"\n\n--- traceback from rank {failure.rank} ---\n{failure.traceback.rstrip()}"
        elif failure.stderr_tail:
            text += f"\n\n--- last lines rank {failure.rank} wrote to stderr ---\n{failure.stderr_tail.rstrip()}"
        super().__init__(text)


class WorkerTimeoutError(WorkerError, TimeoutError):
    """No answer within ``timeout_s``: usually one rank never joined a collective."""


#: What Python's spawn bootstrap prints when a rank, importing the user's script, tries to start ranks itself.
_UNGUARDED_MAIN = "bootstrapping phase"


def explain_death(stderr_tail: str) -> str | None:
    """What a death means when the rank's stderr gives the cause away, and what to do; or None."""
    if _UNGUARDED_MAIN not in stderr_tail:
        return None
    call = _top_level_call_in_main() or "lab.run(...)  # or launch(...), compare(...), Cluster(...)"
    return (
        "your script starts ranks when it is imported. With the 'spawn' start method every rank "
        "first imports the script you ran (as __mp_main__), so each rank ran that call again and tried "
        "to start ranks of its own, which Python refuses. Put the call under a main guard:"
        f'\n\n    if __name__ == "__main__":\n        {call}\n'
    )


def _top_level_call_in_main() -> str | None:
    """The module-level line of the running script that led here (the line to indent), if any."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not main_file:
        return None
    for frame in traceback.extract_stack():
        line = (frame.line or "").strip()
        if frame.filename == main_file and frame.name == "<module>" and line:
            return line if line.count("(") == line.count(")") else None  # a call over several lines
    return None

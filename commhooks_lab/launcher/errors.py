"""The errors a learner meets, each saying which rank failed, how, and what it printed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RankFailure:
    """One rank's failure: it raised (with the worker's traceback), died, or never answered."""

    rank: int
    how: str  # "raised" | "died" | "timeout"
    summary: str
    traceback: str = ""


class WorkerError(RuntimeError):
    """A rank raised, died or hung; every child process is gone by the time you see this."""

    def __init__(self, failure: RankFailure, others: list[RankFailure] | None = None):
        self.failure = failure
        self.rank = failure.rank
        self.how = failure.how
        self.worker_traceback = failure.traceback
        self.others = list(others or [])
        text = f"rank {failure.rank} {failure.summary}"
        if self.others:
            text += "\nalso: " + "; ".join(f"rank {o.rank} {o.summary}" for o in self.others)
        if failure.traceback:
            text += f"\n\n--- traceback from rank {failure.rank} ---\n{failure.traceback.rstrip()}"
        super().__init__(text)


class WorkerTimeoutError(WorkerError, TimeoutError):
    """No answer within ``timeout_s``: usually one rank never joined a collective."""

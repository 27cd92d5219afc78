"""Why a run's ranks failed, in words that name the rank to blame: what :class:`~.cluster.Cluster` raises.

A Cluster only waits and collects; when the wait ends badly it hands what it saw here (the failures the ranks
reported, which ranks fell silent, their heartbeats, how a process ended) and gets back the error to raise.
Echoes (a peer's "connection closed" after the real failure) rank after the root cause; a hang names the rank
the others waited for; a death says how the process ended and, where it can, why (memory, the process limit,
the rank server, a rendezvous folder removed under the ranks).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Iterable

from .collective_log import left_out
from .errors import OtherRankFailed, RankFailure, WorkerError, WorkerTimeoutError, explain_death
from .limits import process_limit_cause
from .oom import killed_for_memory
from .rank_logs import RankLog
from .step_watch import StepWatch

__all__ = [
    "death",
    "describe_exit",
    "failed",
    "hang",
    "is_echo",
    "root_cause_first",
    "silence",
]

_COMM_ECHO = ("connection closed", "connection reset", "broken pipe", "gloo", "nccl", "timed out")


def describe_exit(exitcode: int | None) -> str:
    """How a process ended, as a sentence's end: "exited with code 1", "was killed by signal SIGKILL (-9)"."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name} ({exitcode})"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def is_echo(f: RankFailure) -> bool:
    """A communication error that only reflects another rank's failure (a peer hung up, timed out)."""
    if f.how == "raised" and f.summary.startswith(f"raised {OtherRankFailed.__name__}:"):
        return True
    return f.how == "raised" and any(s in f.summary.lower() for s in _COMM_ECHO)


def root_cause_first(failures: list[RankFailure]) -> list[RankFailure]:
    """Order failures: real exceptions, then deaths, then echoes; the lower rank breaks ties
    (arrival order would make the same failure read differently from run to run)."""
    return sorted(failures, key=lambda f: (2 if is_echo(f) else (1 if f.how == "died" else 0), f.rank))


def silence(
    watch: StepWatch, silent: list[int], timeout_s: float, failures: list[RankFailure], world_size: int, unsent: list
) -> WorkerTimeoutError:
    """The error when the watchdog fires: a rank that never took its task (``unsent``), else the hang."""
    if unsent:
        return _not_reading(unsent, timeout_s, failures)
    error = hang(watch, silent, timeout_s, failures, world_size, watchdog=True)
    assert error is not None  # the watchdog fires only while some rank is silent, and a silent rank is named
    return error


def failed(
    failures: list[RankFailure],
    watch: StepWatch,
    silent: list[int],
    timeout_s: float,
    world_size: int,
    unsent: list,
    rendezvous_folders: Iterable[str],
) -> WorkerError:
    """The error once ranks have failed: the root cause first, or the rank the others gave up waiting for."""
    first, *others = root_cause_first(failures)
    if unsent and is_echo(first):  # the others gave up waiting for a rank that never got its task
        return _not_reading(unsent, timeout_s, failures)
    if is_echo(first):  # a rank gave up waiting in a collective: name the one it waited for
        error = hang(watch, silent, timeout_s, failures, world_size, watchdog=False)
        if error is not None:
            return error
    return WorkerError(_rendezvous_gone(first, rendezvous_folders), others)


def _not_reading(ranks: list[int], timeout_s: float, failures: list[RankFailure]) -> WorkerTimeoutError:
    summary = (
        f"never took its task: {timeout_s:g} s after the run began its pipe was still full, so the process is not "
        "reading (stopped with SIGSTOP or Ctrl-Z, frozen, or swapped out)"
        + (f"; also not reading: ranks {ranks[1:]}" if len(ranks) > 1 else "")
    )
    others = root_cause_first(failures) if failures else None
    return WorkerTimeoutError(RankFailure(ranks[0], "timeout", summary), others)


def _left_out(failures: list[RankFailure], timed_out: frozenset, world_size: int) -> WorkerTimeoutError | None:
    """Every rank timed out in a collective, and one's collectives stopped following its own last step: that one."""
    if len(timed_out) < world_size:
        return None
    logs = {f.rank: f.collectives for f in failures if f.rank in timed_out and f.collectives}
    culprits = left_out(logs)
    if not culprits:
        return None
    log = logs[culprits[0]]
    others = _ranks_text(r for r in range(world_size) if r not in culprits)
    summary = (
        f"fell out of step with the others' collectives (by step {log['step']} it called {log['current'][:4]} where "
        f"its step before began {log['previous'][:4]}, while {others} kept to the pattern and waited): a rank that "
        "leaves out or adds a collective, such as a hook that skips one on some ranks, pairs every later one wrongly "
        "until gloo's timeout"
    )
    rest = [f for f in failures if f.rank != culprits[0]]
    return WorkerTimeoutError(RankFailure(culprits[0], "timeout", summary, step=log["step"]), rest)


def _ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def hang(
    watch: StepWatch, silent: list[int], timeout_s: float, failures: list, world_size: int, *, watchdog: bool
) -> WorkerTimeoutError | None:
    """The error for ranks that stopped making progress (None if nothing points at a rank)."""
    timed_out = frozenset(f.rank for f in failures if is_echo(f))
    skipped = _left_out(failures, timed_out, world_size)
    if skipped is not None:
        return skipped
    cause = process_limit_cause()  # the real cause, where the hang is the process limit's doing
    verdict = watch.verdict(silent, timeout_s, timed_out)
    if verdict is not None:
        listed = f" (ranks the others waited for: {verdict.ranks})" if len(verdict.ranks) > 1 else ""
        summary = verdict.summary + listed
        failure = RankFailure(verdict.ranks[0], "timeout", summary, step=verdict.step, detail=cause)
        return WorkerTimeoutError(failure, root_cause_first(failures) if failures else None)
    if not silent:
        return None
    where = f" (every rank had reached step {max(watch.reached.values())})" if watch.active else ""
    if watchdog:
        summary = (
            f"gave no answer within timeout_s={timeout_s:g} s (ranks without an answer: {silent}){where}; "
            "a rank that never joins a collective hangs the others"
        )
        return WorkerTimeoutError(RankFailure(silent[0], "timeout", summary, detail=cause), failures)
    first = root_cause_first(failures)[0]
    summary = (
        f"gave no answer (ranks without an answer: {silent}) while rank {first.rank} gave up "
        f"waiting for it in a collective{where}: a rank that never joins a collective hangs the others"
    )
    failure = RankFailure(silent[0], "timeout", summary, detail=cause)
    return WorkerTimeoutError(failure, root_cause_first(failures))


def _rendezvous_gone(failure: RankFailure, folders: Iterable[str]) -> RankFailure:
    """``failure``, explained if the ranks' rendezvous folder was removed under them (their store then fails
    with a bare "No such file or directory")."""
    gone = [folder for folder in folders if not os.path.isdir(folder)]
    if not gone or failure.detail:
        return failure
    detail = (
        f"the ranks' rendezvous folder {gone[0]} was removed while they ran (by hand, or a temp-folder cleaner), "
        "and their store's file with it; the next run starts new ranks with a new one"
    )
    return dataclasses.replace(failure, detail=detail)


def death(rank: int, proc, log: RankLog | None, server, phase: str, oom_before: int | None) -> RankFailure:
    """A rank that ended without a Python exception: how, and what it last wrote to stderr. ``server``: the rank
    server that forked it (None under spawn); ``oom_before``: the OOM killer's count when the wait began."""
    proc.join(1.0)
    tail = log.tail() if log is not None else ""
    if not tail and server is not None:  # it died before it took its own stderr: the server has it
        tail = server.log.tail()
    summary = f"{describe_exit(proc.exitcode)} while {phase}"
    explanation = explain_death(tail)
    if explanation:
        summary += ", before it could run your code"
    elif server is not None and _server_died(server):
        explanation = (
            f"the rank server (pid {server.pid}) that forked it died first, and a rank leaves with its "
            "server; the next run starts a new server (start_method='spawn' needs none)"
        )
    elif proc.exitcode == -signal.SIGKILL:
        for_memory, counted = killed_for_memory(oom_before)
        explanation = (
            f"{counted}: this rank was most likely the one killed, for memory. Use a smaller model or batch, "
            "fewer ranks, or close other programs; in a container, raise its memory limit"
            if for_memory
            else f"something outside the lab sent SIGKILL ({counted})"
            if counted
            else ""
        )
    explanation = explanation or process_limit_cause()  # gloo aborts a rank it could not give its threads
    return RankFailure(rank, "died", summary, stderr_tail=tail, detail=explanation)


def _server_died(server, settle_s: float = 0.5) -> bool:
    """Did the rank server die? Asked for a moment: its ranks can notice before it is a zombie we can see."""
    deadline = time.monotonic() + settle_s
    while server.running():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True

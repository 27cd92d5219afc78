"""Name the process limit when it is what stopped a run: under ``ulimit -u`` the kernel refuses a thread, and
gloo says only "Resource temporarily unavailable", Python "can't start new thread", or a rank that could not start
one never joins a collective and the hang looks like any other."""

from __future__ import annotations

import os
import resource

__all__ = ["process_limit_cause", "thread_refused_cause"]

#: What a rank raises when the kernel refuses it a thread: gloo's std::system_error (EAGAIN), and Python's.
REFUSED_THREAD = ("Resource temporarily unavailable", "can't start new thread")


def _enforced_limit() -> int | None:
    """RLIMIT_NPROC's soft limit where it holds (the kernel does not hold root to it), else None."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY or os.geteuid() == 0:
        return None
    return soft


def _threads_of_this_account() -> int | None:
    """How many threads this account runs (RLIMIT_NPROC counts threads, not processes), from /proc; None elsewhere."""
    uid, count = str(os.getuid()), 0
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if fields.get("Uid", "").split()[:1] == [uid]:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count


def process_limit_cause() -> str:
    """A sentence naming the limit if this account is at it (within 5% or 4 threads), else ''."""
    limit = _enforced_limit()
    if limit is None:
        return ""
    used = _threads_of_this_account()
    if used is None or used < limit - max(4, limit // 20):
        return ""
    return (
        f"this account may run at most {limit} processes and threads (ulimit -u) and runs {used}: a rank that "
        "cannot start a thread fails, or never joins the collective and the others wait for it. Raise the limit "
        "(ulimit -u 4096 in the shell that starts Jupyter) or end other programs, then run again"
    )


def thread_refused_cause(message: str) -> str:
    """The limit named when a rank raised because it was refused a thread under an enforced ``ulimit -u`` (gloo
    then says only "Resource temporarily unavailable"), else ''."""
    limit = _enforced_limit()
    if limit is None or not any(words in message for words in REFUSED_THREAD):
        return ""
    return (
        f"the kernel refused a thread: this account may run at most {limit} processes and threads (ulimit -u), and "
        "each rank needs several (gloo's among them). Raise the limit (ulimit -u 4096 in the shell that starts "
        "Jupyter) or end other programs, then run again"
    )

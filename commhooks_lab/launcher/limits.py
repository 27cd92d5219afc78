"""Name the process limit when it is what stopped a rank: under ``ulimit -u`` a rank that cannot start a thread
(gloo starts several per peer) never joins a collective, and the hang looks like any other."""

from __future__ import annotations

import os
import resource

__all__ = ["process_limit_cause"]


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
        "cannot start a thread never joins the collective, and the others wait for it. Raise the limit (ulimit -u "
        "4096 in the shell that starts Jupyter) or end other programs, then run again"
    )

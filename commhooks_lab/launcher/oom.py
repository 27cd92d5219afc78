"""Was a process killed by the kernel's out-of-memory killer? Its count in ``/proc/vmstat`` says.

A rank the OOM killer ends looks like any other ``SIGKILL``. Linux counts every OOM kill, a container's
(cgroup's) included, in ``/proc/vmstat``'s ``oom_kill`` line: if it rose while a run was on, the dead rank was
most likely the one killed. Elsewhere (macOS) there is no count and the lab says only what it knows.
"""

from __future__ import annotations

__all__ = ["killed_for_memory", "oom_kills"]

VMSTAT = "/proc/vmstat"


def oom_kills() -> int | None:
    """How many processes the OOM killer has ended since boot, or None where the kernel does not say."""
    try:
        with open(VMSTAT) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def killed_for_memory(before: int | None) -> tuple[bool, str]:
    """(did the OOM killer act since ``before``, a few words with the counts) for a rank that died by SIGKILL."""
    after = oom_kills()
    if before is None or after is None:
        return False, ""
    if after > before:
        return True, f"the kernel's out-of-memory killer ended {after - before} process(es) meanwhile (/proc/vmstat)"
    return False, "not the out-of-memory killer: its count in /proc/vmstat did not move"

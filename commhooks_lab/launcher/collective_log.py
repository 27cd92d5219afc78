"""Which collectives each rank started in its current step and the step before: who left one out.

When one rank's hook leaves out a collective, its next collective pairs up with the others' missing one, every
rank ends up waiting, and gloo's timeout fires on all of them alike: heartbeats show every rank at the same step.
What tells the culprit is its own history: a rank's collectives repeat from step to step, and the one that left
one out is the one whose current step stopped following its previous step. Each rank keeps both steps' lists (the
Python-level ``torch.distributed`` calls, hooks' included; DDP's own C++ all-reduce is not seen) and sends them
with its error.
"""

from __future__ import annotations

import functools
import threading

__all__ = ["CollectiveLog", "left_out"]

#: The collectives a hook or a training loop calls from Python. Not isend/irecv: ``P2POp`` checks them by identity.
NAMES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "reduce",
    "gather",
    "scatter",
    "batch_isend_irecv",
    "all_to_all",
    "all_to_all_single",
    "barrier",
)
#: Longer step logs are cut: the comparison needs the start of a step, not all of it.
KEEP = 64


class CollectiveLog:
    """This rank's collectives, per step (the step its last heartbeat named)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.step: int | None = None
        self.current: list[str] = []
        self.previous: list[str] = []

    def install(self) -> None:
        """Wrap torch.distributed's collectives in this process (they still do exactly what they did).

        The same wrapper goes into ``torch.distributed`` and ``distributed_c10d``, as the lab's payload counter
        installs its own, so identity checks in PyTorch hold and every other wrapper still sees every call.
        """
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        for name in NAMES:
            original = getattr(distributed_c10d, name, None) or getattr(dist, name, None)
            if original is None or getattr(original, "_commhooks_logged", False):
                continue
            wrapper = self._logged(name, original)
            for module in (distributed_c10d, dist):
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapper)

    def _logged(self, name: str, original):
        """``original``, logged. Not while Dynamo traces it: it cannot enter a lock, and would split the compiled
        graph there (a graph break the hook did not cause), so collectives inside compiled code go unlogged."""
        import torch

        @functools.wraps(original)
        def collective(*args, **kwargs):
            if not torch.compiler.is_compiling():
                with self._lock:
                    if len(self.current) < KEEP:
                        self.current.append(name)
            return original(*args, **kwargs)

        collective._commhooks_logged = True  # type: ignore[attr-defined]
        return collective

    def beat(self, step: int) -> None:
        with self._lock:
            if step != self.step:
                self.step, self.previous, self.current = step, self.current, []

    def snapshot(self) -> dict:
        with self._lock:
            return {"step": self.step, "current": list(self.current), "previous": list(self.previous)}


def left_out(logs: dict[int, dict]) -> list[int]:
    """The ranks whose collectives in their current step stopped following their previous step, when others' did.

    ``logs``: rank -> :meth:`CollectiveLog.snapshot`. Empty when the logs cannot tell (different steps, no
    previous step, or every rank deviates or none does).
    """
    steps = {log["step"] for log in logs.values()}
    if len(logs) < 2 or len(steps) != 1 or None in steps:
        return []
    usable = {r: log for r, log in logs.items() if log["previous"]}
    if len(usable) < len(logs):
        return []
    deviant = [r for r, log in sorted(usable.items()) if log["current"] != log["previous"][: len(log["current"])]]
    return deviant if 0 < len(deviant) < len(logs) else []

"""Run the same worker functions under ``torchrun`` / ``accelerate launch`` on a real cluster.

In a notebook, :func:`~commhooks_lab.launch` starts the ranks; on a cluster the launcher
does, and sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. ``launch_from_env`` joins
that group and calls ``fn(ctx, *args)`` exactly as ``launch`` would. The laptop's limits
(how many ranks, one GPU per rank counted on this machine) do not apply: the launcher
decides the world size, and each rank takes GPU ``LOCAL_RANK`` of its own node.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .devices import backend_and_device
from .options import check_common_options
from .rank_process import WorkerContext

__all__ = ["launch_from_env", "under_torchrun"]

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    """True in a process started by torchrun (or anything that sets its variables)."""
    return all(v in os.environ for v in TORCHRUN_VARIABLES)


def launch_from_env(
    fn: Callable,
    *args: Any,
    backend: str | None = None,
    timeout_s: float = 300.0,
    on_event: Callable[[dict], None] | None = None,
):
    """Join the group torchrun describes, run ``fn(ctx, *args)``; rank 0 gets every rank's value.

    Returns the list of values (rank order) on rank 0 and ``None`` on the other ranks, so a
    script can print or save on rank 0 alone.
    """
    missing = [v for v in TORCHRUN_VARIABLES if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"launch_from_env needs {', '.join(missing)} in the environment: start it with "
            "torchrun --nproc-per-node N ... (or use commhooks_lab.launch in a notebook)"
        )
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    check_common_options(world_size, backend, timeout_s)
    owns_group = not dist.is_initialized()
    if not owns_group and backend is None:
        backend = str(dist.get_backend())  # the group someone else made decides
    backend, device = backend_and_device(backend, local_rank)
    if owns_group:
        dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout_s))
    ctx = WorkerContext(rank, world_size, backend, device, local_rank=local_rank, _sink=on_event if rank == 0 else None)
    try:
        value = fn(ctx, *args)
        gathered = [None] * world_size if rank == 0 else None
        dist.gather_object(value, gathered, dst=0)
        return gathered
    finally:
        if owns_group:
            dist.destroy_process_group()

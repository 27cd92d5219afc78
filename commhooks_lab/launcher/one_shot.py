"""One-shot multi-process runs: start ranks, run one function, hand back its values, clean up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .cluster import Cluster, EventCallback, serialize_task
from .options import DEFAULT_START_METHOD, DEFAULT_TIMEOUT_S
from .rank_spec import RankSpec

__all__ = ["launch"]


def launch(
    fn: Callable,
    *args: Any,
    world_size: int = 2,
    backend: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    start_method: str = DEFAULT_START_METHOD,
    on_event: EventCallback | None = None,
) -> list:
    """Run ``fn(ctx, *args)`` on ``world_size`` fresh DDP ranks and return their values, rank order.

    ``fn`` may be defined in a notebook cell (it travels by value). Any failure raises
    :class:`~commhooks_lab.WorkerError` naming the rank, with every child process gone.
    ``timeout_s`` bounds how long the ranks may go without a sign of life (a heartbeat, an
    event, a result). For repeated runs keep a :class:`~commhooks_lab.Cluster`: it skips the start-up.
    """
    spec = RankSpec(world_size, backend, timeout_s, start_method=start_method)
    payload = serialize_task(fn, args)  # refuse unpicklable input before any process starts
    with Cluster(spec) as cluster:
        return cluster.run_serialized(payload, on_event=on_event)

"""The launcher's smoke test: every rank all-reduces its rank+1 and must see the same sum."""

from __future__ import annotations

__all__ = ["allreduce_rank_plus_one", "selfcheck", "summarize"]


def allreduce_rank_plus_one(ctx) -> dict:
    """Worker: all-reduce ``rank + 1``; every rank should hold W(W+1)/2 afterwards."""
    import os

    import torch
    import torch.distributed as dist

    value = torch.tensor([ctx.rank + 1.0], device=ctx.device)
    dist.all_reduce(value)
    return {"rank": ctx.rank, "pid": os.getpid(), "backend": ctx.backend, "sum": value.item()}


def selfcheck(world_size: int = 2, **launch_options) -> dict:
    """Launch ``world_size`` ranks, all-reduce, and check that every rank agrees on W(W+1)/2."""
    from .one_shot import launch

    rows = launch(allreduce_rank_plus_one, world_size=world_size, **launch_options)
    return summarize(rows, world_size)


def summarize(rows: list[dict], world_size: int) -> dict:
    expected = world_size * (world_size + 1) / 2
    sums = [row["sum"] for row in rows]
    return {
        "world_size": world_size,
        "backend": rows[0]["backend"],
        "expected": expected,
        "sums": sums,
        "ok": all(s == expected for s in sums),
        "pids": [row["pid"] for row in rows],
    }

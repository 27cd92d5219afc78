"""Byte rules: what a hook hands to collectives in a step, from parameter shapes alone.

A registered hook's ``HookEntry.traffic`` is built from these pieces; the network model
(:mod:`commhooks_lab.studies.network`) applies it to real architectures, and a test checks every
rule against the bytes the probe measures on the lab's models. Gradients are float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

__all__ = ["allreduced", "bucket_count", "bucket_sizes", "gathered", "numel", "Shape", "Traffic"]

Shape = tuple[int, ...]
#: allreduce_bytes, allgather_bytes, allreduce_calls, allgather_calls (what one rank hands over per step)
Traffic = dict[str, float]


def numel(shape: Shape) -> int:
    return math.prod(shape)


def bucket_sizes(shapes: Sequence[Shape], bucket_cap_mb: float | None = None) -> list[int]:
    """Elements in each bucket DDP fills with float32 gradients of these shapes, after its first step.

    DDP fills buckets in reverse parameter order (about the order gradients become ready) and closes
    one once it reaches its cap. ``bucket_cap_mb=None`` is DDP's default: 25 MiB, the first bucket
    1 MiB; a cap you pass applies to every bucket (``torch/nn/parallel/distributed.py``,
    ``BucketCapacityConfig``).
    """
    caps = [1.0, 25.0] if bucket_cap_mb is None else [bucket_cap_mb, bucket_cap_mb]
    sizes: list[int] = []
    size = 0
    for shape in reversed(shapes):
        size += numel(shape)
        if 4 * size >= caps[min(len(sizes), 1)] * 2**20:
            sizes, size = [*sizes, size], 0
    return sizes + [size] if size else sizes


def bucket_count(shapes: Sequence[Shape], bucket_cap_mb: float | None = None) -> int:
    """How many buckets (see :func:`bucket_sizes`); only the number of collectives depends on it."""
    return len(bucket_sizes(shapes, bucket_cap_mb))


def allreduced(nbytes: float, calls: float) -> Traffic:
    return {"allreduce_bytes": float(nbytes), "allgather_bytes": 0.0, "allreduce_calls": float(calls),
            "allgather_calls": 0.0}  # fmt: skip


def gathered(
    shapes: Sequence[Shape], per_tensor: Callable[[Shape], int], gathers_per_bucket: int, buckets: int
) -> Traffic:
    """Every tensor's payload all-gathered, ``gathers_per_bucket`` collectives per bucket (one per payload dtype)."""
    return {
        "allreduce_bytes": 0.0,
        "allgather_bytes": float(sum(per_tensor(s) for s in shapes)),
        "allreduce_calls": 0.0,
        "allgather_calls": float(gathers_per_bucket * buckets),
    }

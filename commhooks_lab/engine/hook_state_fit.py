"""Does a loaded hook state fit this model's buckets? Checked at resume, before the first real step.

PowerSGD keeps per-bucket memory (``error_dict``, ``p_memory_dict``, ``q_memory_dict``, keyed by
bucket index) and loads whatever tensors it is given. One of the wrong length (a hand-edited file,
another model's checkpoint) used to fail inside the hook as a bare broadcast or ``view`` error,
blamed on the step. The lengths it must have follow from each bucket's gradients, exactly as
``powerSGD_hook`` and ``batched_powerSGD_hook`` lay them out (torch/distributed/algorithms/
ddp_comm_hooks/powerSGD_hook.py): so they are checked here, with the bucket and the dict named.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..hooks.compressors import CompressorState

__all__ = ["HookStateMismatch", "check_bucket_memory_fits", "check_residuals_fit", "powersgd_lengths"]


class HookStateMismatch(ValueError):
    """A saved hook-state tensor that cannot belong to this model's buckets."""


def _compressed(n: int, m: int, rank: int, min_compression_rate: float) -> bool:
    """powerSGD_hook's _should_compress: worth it only if (n + m) r, times the rate, is under n m."""
    return (n + m) * rank * min_compression_rate < n * m


def powersgd_lengths(shapes: list[torch.Size], rank: int, min_compression_rate: float) -> dict[str, set[int]]:
    """The lengths each per-bucket dict may have for a bucket of gradients with ``shapes``.

    Two layouts are allowed, the plain hook's (one low-rank pair per compressed matrix) and the
    batched hook's (the whole bucket as one square matrix, padded): the state does not say which
    hook uses it.
    """
    total = sum(math.prod(s) for s in shapes)
    p_plain = q_plain = 0
    for shape in shapes:
        n = shape[0] if len(shape) else 1
        m = math.prod(shape) // n if n else 0
        r = min(n, m, rank)
        if _compressed(n, m, r, min_compression_rate):
            p_plain, q_plain = p_plain + n * r, q_plain + m * r
    side = math.ceil(math.sqrt(total))
    return {
        "error_dict": {total, side * side},
        "p_memory_dict": {p_plain, side * rank},
        "q_memory_dict": {q_plain, side * rank},
    }


def check_bucket_memory_fits(state: Any, bucket) -> None:
    """Before PowerSGD first meets ``bucket``: its saved memory for it has a length this bucket can use.

    Checked in the hook, not at load: the buckets a resumed run's first step uses are DDP's rebuilt
    ones, which exist only once that step's forward has run.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    if not isinstance(state, PowerSGDState):
        return
    shapes = [g.shape for g in bucket.gradients()]
    allowed = powersgd_lengths(shapes, state.matrix_approximation_rank, state.min_compression_rate)
    for name, lengths in allowed.items():
        tensor = getattr(state, name, {}).get(bucket.index())
        if tensor is not None and tensor.numel() not in lengths:
            raise HookStateMismatch(
                f"PowerSGD's {name}[{bucket.index()}] has {tensor.numel()} numbers, this model's bucket "
                f"{bucket.index()} needs {' or '.join(str(n) for n in sorted(lengths))}"
            )


def check_residuals_fit(state: Any, parameters: list) -> None:
    """A compressor's saved residuals have their parameters' shapes (checked at load: no bucket needed)."""
    if not isinstance(state, CompressorState):
        return
    position = {id(p): i for i, p in enumerate(parameters)}
    for pid, key in state.keys.items():
        residual = state.memory.get(key)
        param = parameters[position[pid]] if pid in position else None
        if isinstance(residual, torch.Tensor) and param is not None and residual.shape != param.shape:
            raise HookStateMismatch(
                f"the residual for parameter {position[pid]} has shape {tuple(residual.shape)}, "
                f"the parameter {tuple(param.shape)}"
            )

"""The cost of compressing, per gradient element, timed on this machine."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["compression_cost_per_element"]


def _seconds(fn: Callable[[], Any], repeats: int) -> float:
    """Best of ``repeats`` (after a warm-up call): on a shared machine the fastest run is the least disturbed."""
    fn()  # warm-up: allocations, first-call dispatch
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def compression_cost_per_element(
    side: int = 1024,
    matrix_ranks: Sequence[int] = (1, 4),
    ratio: float = 0.01,
    repeats: int = 7,
    threads: int = 1,
) -> dict[str, float]:
    """Seconds per gradient element of each hook's local work, timed here on a ``side`` x ``side`` gradient.

    Keys are the run names of notebook 8's hooks (``fp16``, ``power_sgd r1``, ``topk 1% + EF``, ...).

    Top-k and sign are the registered families' own compressors with error feedback (their registry record builds
    them): ``compress`` (the residual in, encode, the residual out) and ``decode``, the local work
    ``compressor_hook`` does around its all-gather, so a change to a compressor changes its cost. fp16: cast,
    divide, cast back, as ``fp16_compress_hook``. PowerSGD matrix rank r: P = MQ, PyTorch's own orthogonalisation
    (``powerSGD_hook._orthogonalize``), Q = M^T P, M = P Q^T, plus error feedback's add, copy and subtract. One
    thread by default, like the lab's ranks.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        m = torch.randn(side, side, generator=gen)
        jobs: dict[str, Callable[[], Any]] = {"fp16": lambda: m.to(torch.float16).div_(2).to(torch.float32)}
        jobs.update({f"power_sgd r{r}": _power_sgd(m, r, gen) for r in matrix_ranks})
        for name, options in (("topk", {"ratio": ratio}), ("sign", {})):
            label, job = _registered(name, {**options, "error_feedback": True}, m)
            jobs[label] = job
        return {name: _seconds(job, repeats) / m.numel() for name, job in jobs.items()}
    finally:
        torch.set_num_threads(previous)


def _registered(name: str, options: dict, m: torch.Tensor) -> tuple[str, Callable[[], Any]]:
    """The registered compressor family ``name``'s local work on ``m``, under its run name (``topk 1% + EF``)."""
    from ...hooks import registry
    from ...hooks.compressors import Where

    entry = registry.get(name)
    assert entry.build is not None  # register() guarantees it
    _, state = entry.build(entry.options_with_defaults(options), None)
    compressor, where = state.compressor, Where(key=0, step=0, rank=0)
    memory: dict[int, torch.Tensor] = {}  # error feedback's residual, as the hook state keeps it

    def work() -> torch.Tensor:
        return compressor.decode(compressor.compress(m, where, memory), m, where)

    return compressor.name, work


def _power_sgd(m: torch.Tensor, r: int, gen: torch.Generator) -> Callable[[], None]:
    """powerSGD_hook's arithmetic on one matrix, a batch of one as it batches them, with its orthogonalisation."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

    side = m.shape[0]
    batch = m.unsqueeze(0)
    p, q = torch.empty(1, side, r), torch.randn(1, side, r, generator=gen)
    error = torch.zeros_like(batch)

    def work() -> None:
        corrected = batch + error  # error feedback in
        copy = corrected.clone()
        torch.bmm(corrected, q, out=p)
        _orthogonalize(p)
        torch.bmm(corrected.transpose(1, 2), p, out=q)
        torch.bmm(p, q.transpose(1, 2), out=corrected)
        _ = copy - corrected  # error feedback out

    return work

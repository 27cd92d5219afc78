"""Reference solutions to the notebooks' exercises. Peek only when stuck: the notebooks print
them at the end, and call them until you replace them with your own code."""

from __future__ import annotations

import torch
import torch.distributed as dist


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and indices of the k entries of x with the largest magnitude."""
    flat = x.reshape(-1)
    indices = flat.abs().topk(k).indices
    return flat[indices], indices


def topk_ef_hook(state: dict, bucket) -> torch.futures.Future:
    """Top-k with error feedback: send the k largest of (gradient + residual), keep the rest.

    ``state``: {"ratio": 0.01, "error_feedback": True, "residuals": {}}.
    """
    world = dist.get_world_size()
    grad = bucket.buffer()
    corrected = grad + state["residuals"].get(bucket.index(), 0)
    k = max(1, int(state["ratio"] * grad.numel()))
    values, indices = topk(corrected, k)
    if state.get("error_feedback", True):
        sent = torch.zeros_like(corrected)
        sent[indices] = values
        state["residuals"][bucket.index()] = corrected - sent
    gathered_values = [torch.empty_like(values) for _ in range(world)]
    gathered_indices = [torch.empty_like(indices) for _ in range(world)]
    dist.all_gather(gathered_values, values)
    dist.all_gather(gathered_indices, indices)
    grad.zero_()
    for v, i in zip(gathered_values, gathered_indices):
        grad.index_add_(0, i, v)
    grad.div_(world)
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(grad)
    return future


def sign_ef_hook(state: dict, bucket) -> torch.futures.Future:
    """EF-SignSGD: send sign(gradient + residual) and one scale, mean |.|; keep what the signs missed."""
    world = dist.get_world_size()
    grad = bucket.buffer()
    corrected = grad + state["residuals"].get(bucket.index(), 0)
    scale = corrected.abs().mean().reshape(1)
    signs = torch.where(corrected >= 0, 1, -1).to(torch.int8)
    state["residuals"][bucket.index()] = corrected - scale * signs
    gathered_signs = [torch.empty_like(signs) for _ in range(world)]
    gathered_scales = [torch.empty_like(scale) for _ in range(world)]
    dist.all_gather(gathered_signs, signs)
    dist.all_gather(gathered_scales, scale)
    grad.copy_(sum(s * g for s, g in zip(gathered_scales, gathered_signs)) / world)
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(grad)
    return future

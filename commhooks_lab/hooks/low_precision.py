"""Two 16-bit hooks for precision at scale: a ring all-reduce that rounds like NCCL's, and the fix.

- :func:`ring_hook` sums 16-bit chunks hop by hop around a ring (reduce-scatter, then all-gather),
  rounding to the 16-bit format after every addition, as NCCL's ring algorithm does. gloo
  picks its own reduction algorithm, so PyTorch's ``bf16_compress_hook`` over gloo rounds in
  another order; this hook makes the rounding order of a ring explicit on any backend.
- :func:`wire16_sum32_hook` sends the same 16-bit values but adds them in float32: each rank
  receives its chunk from every rank (all-to-all), sums in float32, rounds the sum to 16 bits
  once and all-gathers it. On the busiest link it moves the bytes of a 16-bit ring all-reduce,
  2(W-1)/W of the 16-bit bucket, and its error no longer grows with the number of ranks.

No ``from __future__ import annotations``: DDP compares a hook's return annotation with
``torch.futures.Future[torch.Tensor]`` itself.
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .contract import bucket_tensor, hook_result

__all__ = ["ring_hook", "wire16_sum32_hook", "Wire16State"]


@dataclass
class Wire16State:
    """The 16-bit format on the wire (``torch.bfloat16`` or ``torch.float16``) and the process group."""

    dtype: torch.dtype = torch.bfloat16
    process_group: Any = None

    def state_dict(self) -> dict:
        """Nothing to remember between steps: a checkpoint of these hooks holds no hook state."""
        return {}

    def load_state_dict(self, saved: dict) -> None:
        pass


def ring_allreduce_(chunks: list[torch.Tensor], group: Any = None) -> None:
    """Sum ``chunks`` (this rank's W pieces of one tensor) over all ranks in place, hop by hop.

    Reduce-scatter: in hop s, rank r sends piece (r - s) mod W to its right neighbour and adds
    the piece it receives from its left neighbour, in the pieces' own dtype (one rounding per
    hop). After W-1 hops rank r holds the full sum of piece (r + 1) mod W; an all-gather around
    the same ring hands every rank every summed piece.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    right = dist.get_global_rank(group, (rank + 1) % world) if group is not None else (rank + 1) % world
    left = dist.get_global_rank(group, (rank - 1) % world) if group is not None else (rank - 1) % world
    for phase in ("reduce", "gather"):
        for hop in range(world - 1):
            offset = 0 if phase == "reduce" else 1
            send, recv = (rank - hop + offset) % world, (rank - hop - 1 + offset) % world
            incoming = torch.empty_like(chunks[recv])
            ops = [
                dist.P2POp(dist.isend, chunks[send].contiguous(), right, group),
                dist.P2POp(dist.irecv, incoming, left, group),
            ]
            for request in dist.batch_isend_irecv(ops):
                request.wait()
            if phase == "reduce":
                chunks[recv] += incoming  # rounds to the chunk's dtype: NCCL's per-hop rounding
            else:
                chunks[recv].copy_(incoming)


def ring_hook(state: Wire16State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PyTorch's fp16/bf16 compress hook (cast, divide by W, sum, cast back), summed on an explicit ring."""
    group = state.process_group
    buffer = bucket_tensor(bucket)  # a GradBucket's buffer, or the gradient under compiled autograd
    compressed = buffer.to(state.dtype).div_(dist.get_world_size(group))
    ring_allreduce_(list(compressed.tensor_split(dist.get_world_size(group))), group)
    buffer.copy_(compressed)
    return hook_result(bucket, buffer)


def wire16_sum32_hook(state: Wire16State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """16-bit values on the wire, float32 accumulation: all-to-all, local fp32 sum, 16-bit all-gather.

    The bucket is padded to W equal pieces (gloo's all-gather takes equal sizes only): at most W-1
    extra elements, so its bytes equal a 16-bit all-reduce's exactly when W divides the bucket.
    """
    group = state.process_group
    world = dist.get_world_size(group)
    buffer = bucket_tensor(bucket).view(-1)  # a GradBucket's flat buffer, or a gradient under compiled autograd
    piece = -(-buffer.numel() // world)  # ceil
    wire = torch.zeros(world * piece, dtype=state.dtype, device=buffer.device)
    wire[: buffer.numel()] = buffer.div(world)  # rounds each scaled value to 16 bits once
    received = torch.empty_like(wire)
    dist.all_to_all_single(received, wire, group=group)  # rank r gets every rank's piece r
    summed = received.view(world, piece).to(torch.float32).sum(dim=0).to(state.dtype)  # one more rounding
    gathered = torch.empty_like(wire)
    dist.all_gather(list(gathered.view(world, piece).unbind()), summed, group=group)
    buffer.copy_(gathered[: buffer.numel()])
    return hook_result(bucket, buffer)

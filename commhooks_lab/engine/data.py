"""How each rank gets its batches: sharded and reshuffled per epoch exactly as DistributedSampler does.

The Accelerate path hands its DataLoader to ``accelerator.prepare``, which deals global batch i
to process i mod W. :class:`InterleavedBatchSampler` lays the DistributedSampler batches out in
that order, so both paths train on the very same samples and can be compared bit for bit.
"""

from __future__ import annotations

import torch
from torch.utils.data.distributed import DistributedSampler

from .models import effective_seed

__all__ = ["endless", "InterleavedBatchSampler", "rank_batches"]


def _samplers(dataset, world_size: int, seed: int) -> list[DistributedSampler]:
    seed = effective_seed(seed)
    return [
        DistributedSampler(dataset, num_replicas=world_size, rank=r, shuffle=True, seed=seed, drop_last=True)
        for r in range(world_size)
    ]


def _check_batch_size(dataset, world_size: int, batch_size: int) -> None:
    per_rank = len(dataset) // world_size
    if per_rank < batch_size:
        raise ValueError(
            f"batch_size={batch_size} is larger than the {per_rank} samples each of the "
            f"{world_size} ranks holds; lower batch_size or world_size"
        )


def rank_batches(dataset, rank: int, world_size: int, batch_size: int, seed: int):
    """Endless batches for one rank (plain PyTorch path)."""
    _check_batch_size(dataset, world_size, batch_size)
    sampler = _samplers(dataset, world_size, seed)[rank]
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


class InterleavedBatchSampler(torch.utils.data.Sampler):
    """Global batches r0, r1, ..., r(W-1), r0, ... where rk is rank k's DistributedSampler batch."""

    def __init__(self, dataset, world_size: int, batch_size: int, seed: int):
        _check_batch_size(dataset, world_size, batch_size)
        self.samplers = _samplers(dataset, world_size, seed)
        self.batch_size, self.drop_last, self.epoch = batch_size, True, 0

    def __len__(self) -> int:
        return len(self.samplers[0]) // self.batch_size * len(self.samplers)

    def __iter__(self):
        per_rank = []
        for sampler in self.samplers:
            sampler.set_epoch(self.epoch)
            indices = list(sampler)
            per_rank.append(
                [
                    indices[i : i + self.batch_size]
                    for i in range(0, len(indices) - self.batch_size + 1, self.batch_size)
                ]
            )
        self.epoch += 1
        for step in zip(*per_rank):
            yield from step


def endless(loader):
    """Iterate a DataLoader epoch after epoch."""
    while True:
        yield from loader

"""One rule for a rank's backend and device, whoever started the rank (the lab, torchrun, accelerate).

In a notebook the lab has already checked that this machine has a GPU per rank before it picks
nccl; under torchrun each node runs ``--nproc-per-node`` ranks, so a rank's GPU is its
``LOCAL_RANK`` on its own node, whatever the job's world size.
"""

from __future__ import annotations

from typing import Any

__all__ = ["backend_and_device"]


def backend_and_device(backend: str | None, local_rank: int) -> tuple[str, Any]:
    """``(backend, torch.device)`` for this rank: nccl on ``cuda:local_rank`` (made current), gloo on CPU.

    ``backend=None`` means nccl when this process sees CUDA, gloo otherwise.
    """
    import torch

    cuda = torch.cuda.is_available()
    if backend is None:
        backend = "nccl" if cuda else "gloo"
    if backend != "nccl":
        return backend, torch.device("cpu")
    count = torch.cuda.device_count() if cuda else 0
    if local_rank >= count:
        raise RuntimeError(
            f"backend='nccl' gives each rank a GPU of its own, but this rank has LOCAL_RANK={local_rank} "
            f"and its node has {count} CUDA device(s): start at most {count} rank(s) per node "
            f"(torchrun --nproc-per-node {max(count, 1)}), or use backend='gloo' to run on CPU"
        )
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return backend, device

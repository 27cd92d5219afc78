"""Notebook 12's study: methods that communicate every H steps, beside the per-step hooks, and the DiLoCo outer
step against torchft's (the PyTorch org's fault-tolerance library, ``torchft/local_sgd.py``).

The methods themselves are registry families (:mod:`commhooks_lab.hooks.local_sgd`); this module holds the
line-up, the per-run byte table and the parity check.
"""

from __future__ import annotations

from typing import Any

__all__ = ["bytes_per_run", "lineup", "torchft_parity"]


def lineup(every: tuple[int, ...] = (2, 8, 20)) -> list[str]:
    """Every-step hooks (fp32, fp16, PowerSGD matrix rank 1) and every-H-steps methods, as specs."""
    items = ["allreduce", "fp16", "power_sgd[matrix_approximation_rank=1,start_powerSGD_iter=2]"]
    items += [f"local_sgd[sync_every={h}]" for h in every]
    items += [f"diloco[sync_every={h}]" for h in every]
    return [*items, f"diloco[sync_every={max(every)},compress=bf16]"]


def bytes_per_run(results) -> Any:
    """Bytes each method handed to collectives over its run (one seed's runs), and the share of fp32 DDP's."""
    import pandas as pd

    total = pd.Series({r.name: int(r.steps["payload_bytes"].sum()) for r in results})
    return pd.DataFrame({"bytes_per_run": total, "vs_allreduce": total / total["allreduce"]})


def _outer_steps_both_ways(ctx, steps: int, every: int) -> list[float]:
    """In each rank: one model trained twice, the outer step by the lab's DiLoCo and by torchft's DiLoCo (its
    Manager replaced by a mock whose allreduce averages over the real process group); the largest difference
    per parameter tensor at the end."""
    from unittest.mock import create_autospec

    import torch
    import torch.distributed as dist
    from torchft.local_sgd import DiLoCo as TorchftDiLoCo
    from torchft.manager import Manager
    from torchft.work import _DummyWork

    from ..hooks.local_sgd import DiLoCo, attach

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def batches() -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(100 + ctx.rank)
        return [torch.randn(4, 8, generator=g) for _ in range(steps)]

    def average(tensor: torch.Tensor, should_quantize: bool = False) -> Any:
        dist.all_reduce(tensor)
        tensor /= dist.get_world_size()
        return _DummyWork(tensor)

    manager = create_autospec(Manager)
    manager.errored.return_value = None
    manager._use_async_quorum = False
    manager.should_commit.return_value = True
    manager.current_step.return_value = 0
    manager.allreduce.side_effect = average
    theirs = model()
    inner = torch.optim.AdamW(theirs.parameters(), lr=1e-2)
    outer = torch.optim.SGD(theirs.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    with TorchftDiLoCo(manager, [theirs], inner, outer, sync_every=every):
        for x in batches():
            theirs(x).square().mean().backward()
            inner.step()
            inner.zero_grad()
    ours = model()
    inner = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    diloco = DiLoCo(ours, inner, {"sync_every": every, "outer_lr": 0.7, "outer_momentum": 0.9, "compress": "none"})
    attach(diloco, inner)  # the optimizer's step post-hook, as torchft's DiLoCo registers its own
    for x in batches():
        ours(x).square().mean().backward()
        inner.step()
        inner.zero_grad()
    return [(a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters())]


def torchft_parity(cluster, steps: int = 8, every: int = 4) -> list[list[float]] | str:
    """Per rank, the largest |difference| per parameter tensor between the lab's and torchft's DiLoCo after
    ``steps`` inner AdamW steps (``steps // every`` outer steps); or why it cannot run here."""
    try:
        import torchft.local_sgd  # noqa: F401
    except ImportError as exc:
        return f"torchft does not import here ({exc}): pip install torchft"
    return cluster.run(_outer_steps_both_ways, steps, every)

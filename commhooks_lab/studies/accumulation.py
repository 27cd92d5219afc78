"""Gradient accumulation with ``no_sync()``: which backwards call the hook, and a check that ranks still agree.

With ``k`` micro-batches per optimizer step, the first ``k - 1`` backwards run inside
``model.no_sync()``: DDP's reducer is not prepared for them (``require_backward_grad_sync`` is
False, so ``_post_forward`` skips ``prepare_for_backward``), the gradients accumulate locally,
and the hook is not called. The k-th backward syncs: every bucket's hook runs once, on the sum
of the k local gradients. So bytes per optimizer step do not depend on ``k``, and PowerSGD's
``state.iter`` (advanced once per synced backward, in ``maybe_increase_iter`` when
``bucket.is_last()``) counts optimizer steps, not micro-batches: ``start_powerSGD_iter`` is in
optimizer steps.

:func:`accumulation_table` measures it on real ranks and, after every optimizer step, compares
the ranks' gradients bit for bit: a hook or a setting that silently stops reducing shows up as
``ranks_agree=False``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["accumulation_table"]


def _rank_accumulate(ctx, hook: str, k: int, steps: int, static_graph: bool, warm_sync: bool) -> list[dict]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..hooks import registry
    from ..hooks.choice import build_hook, check_hook_choice
    from ..measure.payload import PayloadCounter

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)),
                static_graph=static_graph)  # fmt: skip
    choice = check_hook_choice(hook, state_options=registry.get(hook).short_run())  # PowerSGD: from step 2
    inner, state = build_hook(choice)
    calls: list[int] = []

    if inner is None:
        raise ValueError(f"{hook}: DDP's built-in all-reduce has no Python hook to count; use 'allreduce'")

    def counted(state, bucket, inner=inner):
        calls.append(bucket.index())
        return inner(state, bucket)

    model.register_comm_hook(state, counted)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + ctx.rank)
    counter = PayloadCounter.install()

    def backward(sync: bool) -> None:
        x = torch.randn(16, 64, generator=data)
        if sync:
            model(x).square().mean().backward()
        else:
            with model.no_sync():
                model(x).square().mean().backward()

    if warm_sync:  # one synced step first: DDP(static_graph=True) needs it before a no_sync backward
        backward(True)
        optimizer.zero_grad()
    rows = []
    for step in range(steps):
        before = len(calls)
        counter.reset()
        counter.active = True
        for micro in range(k):
            backward(sync=micro == k - 1)
        counter.active = False
        sent = counter.payload_bytes
        grad = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
        every = [torch.empty_like(grad) for _ in range(ctx.world_size)]
        dist.all_gather(every, grad)
        rows.append(
            {
                "hook": hook,
                "micro_batches": k,
                "optimizer_step": step,
                "hook_calls": len(calls) - before,
                "payload_bytes": sent,
                "power_sgd_iter": getattr(state, "iter", None),
                "ranks_agree": all(torch.equal(every[0], g) for g in every[1:]),
            }
        )
        optimizer.step()
        optimizer.zero_grad()
    return rows


def accumulation_table(
    hooks: tuple[str, ...] = ("allreduce", "fp16", "power_sgd"),
    micro_batches: tuple[int, ...] = (1, 4),
    steps: int = 4,
    static_graph: bool = False,
    warm_sync: bool = False,
    cluster: Any = None,
):
    """One row per hook, micro-batch count and optimizer step, as rank 0 saw it (``ranks_agree``
    compares every rank's gradient after the step's synced backward)."""
    import pandas as pd

    from ..launcher import Ranks, RankSpec

    rows = []
    with Ranks(cluster, fresh=cluster is None) as ranks:  # yours (any size), else two ranks of its own
        on = ranks(RankSpec(2 if cluster is None else cluster.world_size))
        for hook in hooks:
            for k in micro_batches:
                rows += on.run(_rank_accumulate, hook, k, steps, static_graph, warm_sync)[0]
    return pd.DataFrame(rows)

"""Problems people reported on PyTorch's and Accelerate's trackers, each run on real ranks: broken, then fixed.

Every case is a function each rank runs (``_rank_...``) and a public function that runs it on the ranks you give
and returns a table whose columns are the lab's measurements (``rel_error`` and ``rank_spread`` against the exact
float64 mean, ``nonfinite`` elements, hook calls and payload bytes per optimizer step). The chapter
``notebooks/problems_people_report.ipynb`` reads them; ``tests/multiprocess/test_reported_problems.py`` checks each
diagnosis at 2 and 3 ranks.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "FP16_MAX",
    "autograd_grad",
    "compiled_autograd_cases",
    "fp16_overflow",
    "no_sync_placement",
    "powersgd_payoff",
    "static_graph_accumulation",
]

#: The largest finite float16 value.
FP16_MAX = 65504.0


def _tiny_mlp(seed: int = 0):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def _flat_grad(model) -> Any:
    import torch

    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def _batch_and_local_gradient(rank: int) -> tuple[Any, Any, Any]:
    """This rank's batch for the tiny MLP and the gradient it gives without DDP (the exact mean's ingredient)."""
    import torch

    data = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, 64, generator=data), torch.randint(0, 10, (16,), generator=data)
    local_model = _tiny_mlp(0)
    torch.nn.functional.cross_entropy(local_model(x), y).backward()
    return x, y, _flat_grad(local_model)


def _counted_ddp() -> tuple[Any, list[int]]:
    """The tiny MLP in DDP with PyTorch's all-reduce hook, each call's bucket index appended to the list."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_tiny_mlp(0))
    calls: list[int] = []

    def counted(state, bucket):
        calls.append(bucket.index())
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counted)
    return model, calls


def _exact_and_spread(ctx, local, reduced) -> tuple[float, float, int]:
    """``rel_error`` of ``reduced`` against the float64 mean of every rank's ``local``, ``rank_spread`` (max
    |h_r - h_0| over ranks) and the number of nonfinite elements in ``reduced``."""
    import torch
    import torch.distributed as dist

    every = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(every, local)
    exact = torch.stack([g.double() for g in every]).mean(0)
    held = [torch.empty_like(reduced) for _ in range(ctx.world_size)]
    dist.all_gather(held, reduced)
    finite = torch.isfinite(reduced)
    nonfinite = int((~finite).sum())
    if nonfinite:
        rel = float("inf")
    else:
        rel = float((reduced.double() - exact).norm() / exact.norm())
    spread = max(float((h.double() - held[0].double()).abs().nan_to_num(float("inf")).max()) for h in held)
    return rel, spread, nonfinite


# -- 1. fp16 overflow: sum first, divide after (pytorch/pytorch#57410) ---------------------------------------------


def _sum_then_divide_fp16(state, bucket):
    """The order before PyTorch PR #57410: cast to float16, all-reduce the sum, divide by W after."""
    import torch
    import torch.distributed as dist

    buffer = bucket.buffer()
    half = buffer.to(torch.float16)
    dist.all_reduce(half)
    half.div_(dist.get_world_size())
    buffer.copy_(half)
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(buffer)
    return fut


def _rank_fp16_overflow(ctx, peaks: tuple[float, ...], seed: int) -> list[dict]:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..engine.data import rank_batches
    from ..engine.models import build_task

    hooks = {
        "sum_then_divide": _sum_then_divide_fp16,
        "fp16_compress_hook": fp16_compress_hook,
    }
    task = build_task("lowrank", seed)
    x, y = next(rank_batches(task.train, ctx.rank, ctx.world_size, 32, seed))
    loss_fn = task.loss_fn()

    def gradient(model, scale: float):
        model.zero_grad(set_to_none=True)
        (loss_fn(model(x), y) * scale).backward()
        return _flat_grad(model)

    local = gradient(task.model, 1.0)
    every = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(every, local)
    stacked = torch.stack(every).double()
    peak_local, peak_sum = float(stacked.abs().max()), float(stacked.sum(0).abs().max())
    rows = []
    for peak in peaks:
        scale = peak * FP16_MAX / peak_local  # the largest local gradient becomes peak x FP16_MAX
        for name, hook in hooks.items():
            model = DDP(build_task("lowrank", seed).model)
            model.register_comm_hook(None, hook)
            rel, spread, nonfinite = _exact_and_spread(ctx, local * scale, gradient(model, scale))
            rows.append(
                {
                    "largest_local": peak,
                    "largest_sum": peak * peak_sum / peak_local,
                    "largest_mean": peak * peak_sum / peak_local / ctx.world_size,
                    "hook": name,
                    "nonfinite": nonfinite,
                    "rel_error": rel,
                    "rank_spread": spread,
                }
            )
    return rows


def fp16_overflow(cluster: Any, peaks: tuple[float, ...] = (0.2, 0.75, 1.5), seed: int = 0):
    """One row per loss scale and order of operations, float16 all-reduce of the lab's ``lowrank`` gradient
    multiplied by a loss scale (as a GradScaler does), against the float64 mean of the scaled gradients.

    The scale is chosen so that the largest local gradient element is ``peak`` x :data:`FP16_MAX`
    (``largest_local``); ``largest_sum`` and ``largest_mean`` are then the largest elements of the sum and the mean
    over ranks, in the same unit. ``sum_then_divide`` is the order before PyTorch PR #57410; ``fp16_compress_hook``
    is PyTorch's, which casts, divides by W and then sums."""
    import pandas as pd

    return pd.DataFrame(cluster.run(_rank_fp16_overflow, tuple(peaks), seed)[0])


# -- 2. where no_sync() goes --------------------------------------------------------------------------------------


def _rank_no_sync(ctx, micro_batches: int, steps: int) -> list[dict]:
    import torch

    from ..measure.payload import PayloadCounter

    rows = []
    counter = PayloadCounter.install()
    for placement in ("backward_only", "forward_and_backward"):
        model, calls = _counted_ddp()
        data = torch.Generator().manual_seed(1000 + ctx.rank)
        for step in range(steps):
            before = len(calls)
            counter.reset()
            counter.active = True
            for micro in range(micro_batches):
                x, y = torch.randn(16, 64, generator=data), torch.randint(0, 10, (16,), generator=data)
                last = micro == micro_batches - 1
                if last:
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                elif placement == "backward_only":
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    with model.no_sync():
                        loss.backward()
                else:
                    with model.no_sync():
                        torch.nn.functional.cross_entropy(model(x), y).backward()
            counter.active = False
            grad = _flat_grad(model)
            every = [torch.empty_like(grad) for _ in range(ctx.world_size)]
            torch.distributed.all_gather(every, grad)
            rows.append(
                {
                    "no_sync_around": placement,
                    "optimizer_step": step,
                    "hook_calls": len(calls) - before,
                    "payload_bytes": counter.payload_bytes,
                    "ranks_agree": all(torch.equal(every[0], g) for g in every[1:]),
                }
            )
            model.zero_grad()
    return rows


def no_sync_placement(cluster: Any, micro_batches: int = 4, steps: int = 2):
    """Hook calls and bytes per optimizer step with ``no_sync()`` around the backward only, or around forward
    and backward (DDP arms its hooks in forward: ``_post_forward`` calls ``prepare_for_backward`` when
    ``require_backward_grad_sync`` is True); ``ranks_agree`` compares every rank's gradient after the step."""
    import pandas as pd

    return pd.DataFrame(cluster.run(_rank_no_sync, micro_batches, steps)[0])


# -- 3. compiled autograd and DDP's C++ reducer (pytorch/pytorch#152735) ------------------------------------------


def _rank_compiled_autograd(ctx, cases: tuple[str, ...]) -> list[dict]:
    import torch
    import torch._dynamo
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .. import _compat
    from ..engine.ddp_job import quiet_dynamo
    from .availability import root_error

    x, y, local = _batch_and_local_gradient(ctx.rank)
    rows = []
    for case in cases:
        reducer = {"cpp_reducer": "ddp_optimizer", "python_reducer": "python_reducer"}[case]
        torch._dynamo.reset()
        error = ""
        with _compat.optimize_ddp(reducer), quiet_dynamo():
            model = DDP(_tiny_mlp(0))  # optimize_ddp is read here, when DDP wraps the model
            run = torch.compile(model, backend="aot_eager")
            try:
                loss = torch.nn.functional.cross_entropy(run(x), y)
                with _compat.compiled_autograd(torch.compile(backend="aot_eager")):
                    loss.backward()
                grad = _flat_grad(model)
            except Exception as exc:
                error, grad = root_error(exc), None
        failed = torch.tensor(float(grad is None))
        torch.distributed.all_reduce(failed, op=torch.distributed.ReduceOp.MAX)
        if bool(failed):
            rows.append({"case": case, "runs": False, "error": error, "rel_error": None, "rank_spread": None})
            continue
        rel, spread, _ = _exact_and_spread(ctx, local, grad)
        rows.append({"case": case, "runs": True, "error": "", "rel_error": rel, "rank_spread": spread})
    return rows


def compiled_autograd_cases(cluster: Any, cases: tuple[str, ...] = ("cpp_reducer", "python_reducer")):
    """One row per case: the compiled DDP model's backward under compiled autograd, over DDP's C++ reducer
    (``cpp_reducer``: ``optimize_ddp`` at ``"ddp_optimizer"``, Dynamo's default) or its Python reducer
    (``python_reducer``). Whether the backward ran, its error, and the gradient's ``rel_error`` and
    ``rank_spread``. The C++ reducer's refusal takes well under a second; the Python reducer's compile, seconds."""
    import pandas as pd

    return pd.DataFrame(cluster.run(_rank_compiled_autograd, tuple(cases))[0])


# -- 4. gradient accumulation with static_graph=True (huggingface/accelerate#3679) ----------------------------------


def static_graph_accumulation(cluster: Any, micro_batches: int = 4, steps: int = 2):
    """``static_graph=True`` with ``no_sync()`` micro-batches, run by the lab's accumulation study: first as
    reported (the first backward inside ``no_sync()``), then with one synced step first (``warm_sync``), then with
    ``static_graph=False``. One row per setup: whether it ran, its error, and ``ranks_agree`` over its steps.
    The cluster replaces ranks that raised, so the setups after the first run on new ranks."""
    import pandas as pd

    from ..launcher import WorkerError
    from .accumulation import accumulation_table

    rows = []
    for setup, options in (
        ("static_graph=True, no_sync() first", {"static_graph": True}),
        ("static_graph=True, one synced step first", {"static_graph": True, "warm_sync": True}),
        ("static_graph=False", {"static_graph": False}),
    ):
        try:
            table = accumulation_table(("allreduce",), (micro_batches,), steps, cluster=cluster, **options)
        except WorkerError as exc:
            first = str(exc).split("\n")[0]
            rows.append({"setup": setup, "runs": False, "error": first, "ranks_agree": None})
            continue
        rows.append({"setup": setup, "runs": True, "error": "", "ranks_agree": bool(table["ranks_agree"].all())})
    return pd.DataFrame(rows)


# -- 5. PowerSGD that does not speed up (pytorch/pytorch#74148) ------------------------------------------------


def powersgd_payoff(
    cluster: Any,
    world_sizes: tuple[int, ...] = (2, 8, 64),
    overlaps: tuple[float, ...] = (0.0, 0.5),
    rank: int = 1,
    steps: int = 4,
):
    """The bandwidth below which PowerSGD's gradient time beats all-reduce's (the alpha-beta model's
    ``break_even``, compression work counted as free), for the lab's MLP (bytes and collectives measured on
    ``cluster``) and ResNet-50 (the byte rule), by world size and the share of all-reduce hidden behind backward.
    Also what a step hands to collectives: ``allreduce_calls`` and ``allreduce_bytes`` per step."""
    import pandas as pd

    from ..experiment import run
    from .network import alpha_beta, byte_rules
    from .network.architectures import architectures

    options = {"matrix_approximation_rank": rank, "start_powerSGD_iter": 2}
    on = {"steps": steps, "cluster": cluster, "world_size": cluster.world_size, "measure": False}
    measured = {
        "allreduce": alpha_beta.traffic(run(hook="allreduce", **on)),
        "power_sgd": alpha_beta.traffic(run(hook="power_sgd", state_options=options, **on)),
    }
    resnet = architectures(include_lab_models=False)["ResNet-50"]
    ruled = {
        "allreduce": byte_rules.rule_traffic(resnet, "allreduce"),
        "power_sgd": byte_rules.rule_traffic(resnet, "power_sgd", matrix_approximation_rank=rank),
    }
    rows = []
    for model, traffics in (("lab MLP", measured), ("ResNet-50", ruled)):
        for w in world_sizes:
            for overlap in overlaps:
                found = alpha_beta.break_even(traffics, world_size=w, overlap=overlap).iloc[0]
                rows.append(
                    {
                        "model": model,
                        "world_size": w,
                        "overlap": overlap,
                        "allreduce_calls": traffics["allreduce"]["allreduce_calls"],
                        "power_sgd_calls": traffics["power_sgd"]["allreduce_calls"],
                        "bytes_vs_allreduce": float(found["link_bytes_vs_baseline"]),
                        "break_even_gbps": float(found["break_even_gbps"]),
                    }
                )
    return pd.DataFrame(rows)


# -- 6. torch.autograd.grad on a DDP model (pytorch/pytorch#47562) ----------------------------------------------


def _rank_autograd_grad(ctx) -> list[dict]:
    import torch

    x, y, local = _batch_and_local_gradient(ctx.rank)
    rows = []
    for how in ("autograd.grad", "backward"):
        model, calls = _counted_ddp()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if how == "backward":
            loss.backward()
            grad = _flat_grad(model)
        else:
            grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))])
        rel, spread, _ = _exact_and_spread(ctx, local, grad)
        rows.append({"gradient_from": how, "hook_calls": len(calls), "rel_error": rel, "rank_spread": spread})
    return rows


def autograd_grad(cluster: Any):
    """The same loss differentiated with ``torch.autograd.grad`` and with ``backward()`` on a DDP model with a
    counting all-reduce hook: hook calls, and the gradient's ``rel_error`` and ``rank_spread`` against the exact
    mean."""
    import pandas as pd

    return pd.DataFrame(cluster.run(_rank_autograd_grad)[0])

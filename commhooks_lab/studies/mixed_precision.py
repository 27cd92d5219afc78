"""Mixed precision with hooks: what autocast hands a hook, GradScaler after a 16-bit all-reduce, clipping after
the hook, and PowerSGD's float16 overflow against the world size (notebook 10).

- **Autocast.** Under ``torch.autocast`` the parameters stay float32: autocast casts a float32 weight to the
  low-precision dtype for each op, and the backward of that cast (``_to_copy``'s entry in PyTorch's
  ``tools/autograd/derivatives.yaml``, ``_to_copy_backward``) casts the gradient back to the weight's dtype. DDP's
  reducer sizes each bucket with its parameters' dtype, so the hook gets a float32 bucket whose values came out
  of bfloat16 (or float16) matmuls. :func:`autocast_table` measures the dtype and how many of those values a
  16-bit cast leaves unchanged.
- **GradScaler.** ``scaler.scale(loss).backward()`` runs the hooks on the *scaled* gradients; the scaler's
  inf/NaN check (``GradScaler.unscale_``, in ``torch/amp/grad_scaler.py``) runs in ``scaler.step``, after the
  hook, on the all-reduced gradient. ``fp16_compress_hook`` casts before it divides by W (``_compress_hook`` in
  ``default_hooks.py``: ``buffer.to(dtype).div_(world_size)``), so a scaled value of magnitude 65520 or more
  becomes infinity, every rank sees it after the sum, and the scaler skips the step and halves its scale.
  :func:`scaler_table` records the scale, the skips and the clipping norm step by step.
- **PowerSGD in float16** (``fp16_compress_wrapper(powerSGD_hook)``): the wrapper casts the bucket to float16
  (no division), P = M Q is all-reduced as a sum and never divided by W ("Since these Ps will be orthogonalized
  later, no need to divide them by world size", ``powerSGD_hook``), and ``_orthogonalize_gram_schmidt`` divides
  each column by its float16 norm ("col ** 2 can underflow/overflow if we use FP16"). :func:`powersgd_fp16_limits`
  finds, for each W, the largest power-of-two gradient scale at which each of these stays finite, replayed in one
  process; :func:`powersgd_fp16_real` measures the same on real ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "FP16_OVERFLOW",
    "STAGES",
    "largest_finite",
    "autocast_table",
    "powersgd_fp16_limits",
    "powersgd_fp16_real",
    "powersgd_fp16_replay",
    "scaler_table",
]

#: The smallest magnitude that rounds to infinity in float16: 65504 plus half its last step (32 / 2).
FP16_OVERFLOW = 65520.0

_AUTOCAST = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: What the PowerSGD replay and the real ranks report per scale, in the order the hook meets them.
STAGES = ("cast", "p_local", "p_sum", "p_norm", "output")


def _hook_fn(name: str):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hooks = {
        "allreduce": default_hooks.allreduce_hook,
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
    }
    if name not in hooks:
        raise ValueError(f"hook {name!r}: choose one of {sorted(hooks)}")
    return hooks[name]


def _task_and_batches(ctx, seed: int = 0, batch_size: int = 32):
    """The lab's digits MLP and this rank's batches: the same as ``lab.run(model="mlp")`` and
    :func:`commhooks_lab.studies.precision.local_gradients`."""
    from ..engine.data import rank_batches
    from ..engine.models import build_task

    task = build_task("mlp", seed)
    return task, rank_batches(task.train, ctx.rank, ctx.world_size, batch_size, seed)


def _gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    import torch.distributed as dist

    every = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(every, tensor.contiguous())
    return every


def _same_bits(tensors: Sequence[torch.Tensor]) -> bool:
    """Bit for bit, so that NaN equals NaN (``torch.equal`` says NaN != NaN)."""
    bits = [t.view(torch.int32) for t in tensors]
    return all(torch.equal(bits[0], b) for b in bits[1:])


def _rank_autocast(ctx, autocast: str, hook: str) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    task, batches = _task_and_batches(ctx)
    model = DDP(task.model)
    inner = _hook_fn(hook)
    seen: dict[str, Any] = {}

    def recording_hook(state, bucket):  # no annotations: DDP checks them, and this module postpones them
        seen["dtype"] = bucket.buffer().dtype
        seen["local"] = bucket.buffer().detach().clone()
        return inner(state, bucket)

    model.register_comm_hook(None, recording_hook)
    x, y = next(batches)
    dtype = _AUTOCAST[autocast]
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        loss = task.loss_fn()(model(x), y)
    loss.backward()
    local = seen["local"]
    exact = torch.stack(_gather(local)).double().mean(dim=0)
    # One bucket (9,610 float32 values), in the parameters' order at the first step.
    reduced = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).double()
    if reduced.shape != exact.shape:
        raise AssertionError("the digits MLP should fit one bucket")
    return {
        "autocast": autocast,
        "hook": hook,
        "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "dtype_in_hook": str(seen["dtype"]).replace("torch.", ""),
        "bf16_exact": float((local.to(torch.bfloat16).float() == local).double().mean()),
        "fp16_exact": float((local.to(torch.float16).float() == local).double().mean()),
        "rel_error": float((reduced - exact).norm() / exact.norm()),
    }


def autocast_table(
    autocasts: Sequence[str] = ("float32", "bfloat16"),
    hooks: Sequence[str] = ("allreduce", "bf16", "fp16"),
    world_size: int = 4,
    cluster: Any = None,
):
    """One training step per autocast dtype and hook, as rank 0 saw it: the parameters' dtype, the dtype of the
    bucket the hook gets, the share of its values a bfloat16 (float16) cast leaves unchanged, and the hook's
    ``rel_error`` against the float64 mean of the ranks' local gradients."""
    import pandas as pd

    from ..launcher import Ranks, RankSpec

    rows = []
    with Ranks(cluster, fresh=cluster is None) as ranks:
        on = ranks(RankSpec(world_size))
        for autocast in autocasts:
            for hook in hooks:
                rows.append(on.run(_rank_autocast, autocast, hook)[0])
    return pd.DataFrame(rows)


def _rank_scaler(
    ctx, hook: str, autocast: str, steps: int, init_scale: float, growth_interval: int, max_norm: float
) -> list[dict]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    task, batches = _task_and_batches(ctx)
    model = DDP(task.model)
    inner = _hook_fn(hook)
    seen: dict[str, torch.Tensor] = {}

    def recording_hook(state, bucket):  # no annotations: DDP checks them, and this module postpones them
        seen["local"] = bucket.buffer().detach().clone()
        return inner(state, bucket)

    model.register_comm_hook(None, recording_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    dtype = _AUTOCAST[autocast]
    rows = []
    for step in range(steps):
        x, y = next(batches)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = task.loss_fn()(model(x), y)
        scale = float(scaler.get_scale())
        scaler.scale(loss).backward()
        local_max = seen["local"].abs().max().reshape(1)
        local_nonfinite = (~seen["local"].isfinite()).any().reshape(1)
        scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).reshape(1)
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
        scaler.step(optimizer)
        scaler.update()
        norms, maxes = _gather(norm), _gather(local_max)
        every = _gather(grads)
        rows.append(
            {
                "autocast": autocast,
                "hook": hook,
                "step": step,
                "scale": scale,
                "skipped": float(scaler.get_scale()) < scale,
                "largest_scaled_grad": float(torch.cat(maxes).max()),
                "backward_overflowed": bool(torch.cat(_gather(local_nonfinite)).any()),
                "clip_norm": float(norm),
                "ranks_agree_on_norm": _same_bits(norms),
                "ranks_agree_on_grads": _same_bits(every),
            }
        )
    return rows


def scaler_table(
    hooks: Sequence[str] = ("allreduce", "fp16"),
    autocasts: Sequence[str] = ("float32", "float16"),
    steps: int = 12,
    init_scale: float = 2.0**20,
    growth_interval: int = 3,
    max_norm: float = 1.0,
    world_size: int = 4,
    cluster: Any = None,
):
    """Train ``steps`` steps with ``torch.amp.GradScaler`` per autocast dtype and hook, and clip after
    ``scaler.unscale_``. One row per step, as rank 0 saw it: the scale the step used, whether the scaler skipped
    it, the largest scaled local gradient any rank handed its hook, whether a local gradient was already
    infinite before the hook (the backward overflowed), the norm ``clip_grad_norm_`` returned, and whether every
    rank had the same norm and the same clipped gradient."""
    import pandas as pd

    from ..launcher import Ranks, RankSpec

    rows = []
    with Ranks(cluster, fresh=cluster is None) as ranks:
        on = ranks(RankSpec(world_size))
        for autocast in autocasts:
            for hook in hooks:
                rows += on.run(_rank_scaler, hook, autocast, steps, init_scale, growth_interval, max_norm)[0]
    return pd.DataFrame(rows)


# -- PowerSGD in float16 ------------------------------------------------------------------------------------------


def _normalize(col: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt at matrix rank 1, as ``_orthogonalize_gram_schmidt`` does it in the column's dtype (torch 2.13
    divides by ``torch.norm(col, dim=1, keepdim=True)``, 2.14 by ``torch.linalg.vector_norm``: the same bits)."""
    return col / torch.linalg.vector_norm(col, dim=1, keepdim=True)


def _first_qs(shapes: Sequence[tuple[int, ...]], seed: int) -> list[torch.Tensor]:
    """PowerSGD's first random Qs (matrix rank 1, float16), drawn and orthogonalised as ``powerSGD_hook`` does:
    ``torch.manual_seed(state.rng.randint(1_000_000_000))`` with ``state.rng = np.random.RandomState(seed)``,
    then one ``torch.randn`` per compressed matrix, in the bucket's order."""
    import numpy as np

    generator = torch.Generator().manual_seed(int(np.random.RandomState(seed).randint(1_000_000_000)))
    return [_normalize(torch.randn(1, shape[1], 1, generator=generator, dtype=torch.float16)) for shape in shapes]


def _compressed_shapes(grads_by_param: Sequence[torch.Tensor]) -> list[int]:
    """Which of the bucket's tensors PowerSGD compresses at matrix rank 1 with its default
    ``min_compression_rate=2``: (n + m) * 2 < n * m (``_should_compress``)."""
    chosen = []
    for i, g in enumerate(grads_by_param):
        n = g.shape[0]
        m = g.numel() // n
        if (n + m) * min(n, m, 1) * 2 < n * m:
            chosen.append(i)
    return chosen


def _stages(per_rank: list[list[torch.Tensor]], scale: float, qs: list[torch.Tensor], chosen: list[int]) -> dict:
    """Which of PowerSGD's float16 stages stay finite at this gradient scale (every rank; ranks' tensors in the
    bucket's order). ``p_norm``: every column norm of the summed P is finite (Gram-Schmidt divides by it)."""
    world = len(per_rank)
    cast = [[(g * scale).to(torch.float16) for g in grads] for grads in per_rank]
    ok = {"cast": all(bool(t.isfinite().all()) for grads in cast for t in grads)}
    ps = [[torch.bmm(grads[i].reshape(1, grads[i].shape[0], -1), q) for i, q in zip(chosen, qs)] for grads in cast]
    ok["p_local"] = all(bool(p.isfinite().all()) for rank in ps for p in rank)
    # The sum in float32, rounded to float16 once: gloo adds in an order of its own, with a float16 rounding per
    # addition, so a partial sum can overflow in one order and not another; rounding once models no order.
    summed = [torch.stack([rank[j] for rank in ps]).float().sum(dim=0).half() for j in range(len(chosen))]
    ok["p_sum"] = all(bool(p.isfinite().all()) for p in summed)
    norms = [torch.linalg.vector_norm(p, dim=1, keepdim=True) for p in summed]
    ok["p_norm"] = all(bool(n.isfinite().all()) for n in norms)
    outs = []
    for j, i in enumerate(chosen):
        p = summed[j] / norms[j]
        qs_r = [torch.bmm(grads[i].reshape(1, grads[i].shape[0], -1).transpose(1, 2), p) for grads in cast]
        q = torch.stack(qs_r).float().sum(dim=0).half()  # rounded once, as P's sum above
        outs.append(torch.bmm(p, (q / world).transpose(1, 2)))
    return {**ok, **_output_flags(outs)}


def _output_flags(layers: Sequence[torch.Tensor]) -> dict[str, bool]:
    """``output``: every compressed layer's result finite and not all zero; ``zeroed``: some layer came back all
    zeros with no inf or NaN anywhere, which a GradScaler cannot see (as when Gram-Schmidt divides a finite column
    by a norm that overflowed: ``col / inf`` is 0)."""
    finite = all(bool(t.isfinite().all()) for t in layers)
    return {
        "output": finite and all(bool((t != 0).any()) for t in layers),
        "zeroed": finite and any(not bool((t != 0).any()) for t in layers),
    }


def largest_finite(rows: list[dict], world: int) -> dict:
    """Per stage, the largest log2 scale up to which (every scale from the smallest) that stage stayed finite."""
    out: dict[str, Any] = {"world_size": world}
    for stage in STAGES:
        good = None
        for row in sorted(rows, key=lambda r: r["log2_scale"]):
            if not row[stage]:
                break
            good = row["log2_scale"]
        out[stage] = good
    out["zeroed_at"] = [row["log2_scale"] for row in rows if row.get("zeroed")]
    return out


def powersgd_fp16_replay(
    world_size: int, log2_scales: Sequence[int] = tuple(range(8, 24)), seed: int = 0
) -> list[dict]:
    """Per power-of-two gradient scale 2**k, which stages of ``fp16_compress_wrapper(powerSGD_hook)`` (matrix
    rank 1, its first compressed step) stay finite on every rank, replayed in one process on the ranks' local
    gradients of the digits MLP (:func:`.precision.local_gradients`).

    Stages: ``cast`` (the wrapper's float16 cast of each rank's scaled gradient), ``p_local`` (each rank's
    P = M Q), ``p_sum`` (P all-reduced as a sum), ``p_norm`` (the norm Gram-Schmidt divides each column of P by)
    and ``output`` (the hook's result finite and not all zero in every compressed layer); ``zeroed``: a compressed
    layer came back all zeros with nothing infinite, an overflow no inf/NaN check sees.
    """
    from .precision import local_gradients, one_thread

    grads = local_gradients("mlp", world_size, seed=0)
    per_rank = [_split(g, _param_shapes()) for g in grads]  # one bucket, in the parameters' order (measured)
    chosen = _compressed_shapes(per_rank[0])
    qs = _first_qs([tuple(per_rank[0][i].reshape(per_rank[0][i].shape[0], -1).shape) for i in chosen], seed)
    with one_thread():
        return [{"log2_scale": k, **_stages(per_rank, 2.0**k, qs, chosen)} for k in log2_scales]


def powersgd_fp16_limits(
    world_sizes: Sequence[int] = (2, 3, 4, 8), log2_scales: Sequence[int] = tuple(range(8, 24)), seed: int = 0
):
    """A table, one row per W: per stage of :func:`powersgd_fp16_replay`, the largest k such that the stage
    stayed finite at every scale 2**j with j <= k (None if it failed at the smallest)."""
    import pandas as pd

    rows = [largest_finite(powersgd_fp16_replay(w, log2_scales, seed), w) for w in world_sizes]
    return pd.DataFrame(rows).set_index("world_size")


def _param_shapes() -> list[torch.Size]:
    from ..engine.models import build_task

    return [p.shape for p in build_task("mlp", 0).model.parameters()]


def _split(flat: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    out, start = [], 0
    for shape in shapes:
        n = int(torch.Size(shape).numel())
        out.append(flat[start : start + n].reshape(shape))
        start += n
    return out


def _rank_powersgd_fp16(ctx, log2_scales: Sequence[int], seed: int) -> list[dict]:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..engine.models import build_task

    task, batches = _task_and_batches(ctx)
    x, y = next(batches)
    seen: dict[str, Any] = {}
    wrapped = default_hooks.fp16_compress_wrapper(powerSGD_hook.powerSGD_hook)

    def fp16_powersgd(state, bucket):  # no annotations: DDP checks them, and this module postpones them
        tensors = bucket.gradients()
        seen["shapes"] = [tuple(t.shape) for t in tensors]
        seen["rows"] = [tensors[i].shape[0] for i in _compressed_shapes(tensors)]
        seen["cast"] = bool(bucket.buffer().to(torch.float16).isfinite().all())
        return wrapped(seen["state"], bucket)

    original = dist.all_reduce

    def watching_all_reduce(tensor, *args, **kwargs):
        if tensor is not seen["state"].p_memory_dict.get(0):
            return original(tensor, *args, **kwargs)
        seen["p_local"] = bool(tensor.isfinite().all())
        work = original(tensor, *args, **kwargs)
        work.wait()  # gloo: the sum is in place once this returns; the hook's own wait returns at once
        seen["p_sum"] = bool(tensor.isfinite().all())
        columns = tensor.split(seen["rows"])  # matrix rank 1: one column of n values per compressed matrix
        seen["p_norm"] = all(bool(torch.linalg.vector_norm(c).isfinite()) for c in columns)
        return work

    rows = []
    dist.all_reduce = watching_all_reduce
    try:
        for k in log2_scales:
            seen.update(
                state=powerSGD_hook.PowerSGDState(
                    process_group=None,
                    matrix_approximation_rank=1,
                    start_powerSGD_iter=0,
                    use_error_feedback=False,
                    warm_start=False,
                    random_seed=seed,
                ),
                p_local=False,
                p_sum=False,
                p_norm=False,
            )
            # A fresh DDP per scale: each is a first step, with the bucket in the parameters' order (after its
            # first step DDP rebuilds the bucket in the order gradients arrive, which changes PowerSGD's Q draws).
            model = DDP(build_task("mlp", 0).model)
            model.register_comm_hook(None, fp16_powersgd)
            (task.loss_fn()(model(x), y) * 2.0**k).backward()  # a power of two: the scaled gradient is exact
            layers = [p.grad for p in model.parameters() if p.grad is not None and p.grad.dim() > 1]
            flags = {**{s: seen[s] for s in STAGES[:-1]}, **_output_flags(layers)}
            every = torch.stack(_gather(torch.tensor(list(flags.values()))))
            agreed = every.all(dim=0).tolist()
            agreed[-1] = bool(every[:, -1].any())  # zeroed: on some rank (the result is the same on every rank)
            rows.append({"log2_scale": k, **dict(zip(flags, map(bool, agreed))), "bucket_shapes": seen["shapes"]})
    finally:
        dist.all_reduce = original
    return rows


def powersgd_fp16_real(
    world_size: int, log2_scales: Sequence[int] = tuple(range(8, 24)), seed: int = 0, cluster: Any = None
) -> list[dict]:
    """:func:`powersgd_fp16_replay`'s rows measured on real ranks with PyTorch's own
    ``fp16_compress_wrapper(powerSGD_hook)`` (one step per scale, a fresh ``PowerSGDState`` each, so every
    scale draws the same first Q), plus the shapes of the bucket's tensors in its order."""

    from ..launcher import Ranks, RankSpec

    with Ranks(cluster, fresh=cluster is None) as ranks:
        return ranks(RankSpec(world_size)).run(_rank_powersgd_fp16, list(log2_scales), seed)[0]

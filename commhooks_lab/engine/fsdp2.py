"""The same measurements for FSDP2 (``torch.distributed.fsdp.fully_shard``), where gradients are
reduce-scattered instead of all-reduced.

FSDP2 has no comm hooks in DDP's sense; its hook points are ``MixedPrecisionPolicy(reduce_dtype=...)``
(the dtype gradients are reduced in: DDP's fp16/bf16 hooks' counterpart), ``set_custom_reduce_scatter``,
``set_all_reduce_hook``, ``set_gradient_divide_factor`` and ``set_force_sum_reduction_for_comms``.
This worker trains a lab task with every ``nn.Linear``/``nn.Conv2d`` and the root wrapped by
``fully_shard`` and measures each step against the float64 mean of the ranks' *unsharded* local
gradients, computed on an unsharded copy of the model that holds the same parameters: the same
``rel_error``, ``cosine`` and per-parameter rows as a DDP run, and the bytes per collective.

``reduce_dtype`` is chosen with the hook names a DDP user knows: ``allreduce`` (float32),
``fp16`` (float16) and ``bf16`` (bfloat16). ``config.fsdp2_comm`` swaps what moves the gradients
(:mod:`commhooks_lab.engine.fsdp2_comm_spec`): the lab's custom reduce-scatter, native HSDP, or HSDP with the
lab's replica all-reduce hook (:mod:`commhooks_lab.engine.fsdp2_comms`). Each step also reports ``rank_spread``
(0 when every rank holds the same whole gradient: under HSDP each node gathers its own copy), ``wire_bytes`` and,
``intra_bytes``/``inter_bytes`` (ring bytes on groups inside a node, and across nodes).
"""

from __future__ import annotations

import copy
import math
import time

import torch
import torch.distributed as dist

__all__ = ["fsdp2_job", "reduce_dtype"]


def reduce_dtype(choice) -> torch.dtype:
    """The FSDP2 reduce_dtype that does the DDP hook's arithmetic on the gradients (its registry record says)."""
    entry = getattr(choice, "entry", None)
    name = getattr(entry, "fsdp2_reduce_dtype", None)
    if name is None:
        raise ValueError(f"api='fsdp2' takes a hook whose registry record names a reduce_dtype, got {choice!r}")
    return getattr(torch, name)


def _shard(model: torch.nn.Module, reduce_dtype: torch.dtype) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear | torch.nn.Conv2d):
            fully_shard(module, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (an all-gather), or the tensor itself."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _errors(h: torch.Tensor, exact: torch.Tensor) -> dict:
    """rel_error, cosine and max_abs_error, from the same sums the DDP probe's measurement uses."""
    from ..measure.metrics import errors_from_sums

    diff = h - exact
    return errors_from_sums(float(diff @ diff), float(exact @ exact), float(h @ h), float(diff.abs().max()))


def _rank_spread(h: torch.Tensor) -> float:
    """max |h_r - h_0| over ranks and entries (uncounted): 0 when every rank ends with the same whole gradient."""
    first = h.clone()
    dist.broadcast(first, 0)
    spread = (h - first).abs().max().reshape(1)
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    return float(spread)


def _add_drift(drift, h: torch.Tensor, exact: torch.Tensor):
    """The running sums of ``h - exact`` and of ``exact`` (what error feedback keeps close)."""
    if drift is None:
        return h - exact, exact.clone()
    return drift[0] + (h - exact), drift[1] + exact


def _comm_note(spec: str) -> str:
    from .fsdp2_comm_spec import COMMS, parse_fsdp2_comm

    name, options = parse_fsdp2_comm(spec)
    assert name is not None
    said = ", ".join(f"{k}={v}" for k, v in options.items())
    return f"fsdp2_comm={name}" + (f" ({said})" if said else "") + f": {COMMS[name].summary}."


def fsdp2_job(ctx, config, choice) -> dict:
    """Worker: train ``config.steps`` steps with FSDP2 and measure each one; rank 0 returns the tables.

    ``choice`` (the checked hook choice, the same call shape as ``ddp_job``) names the reduce_dtype.
    """
    from ..measure.payload import PayloadCounter, written_bytes
    from .data import rank_batches
    from .ddp_job import accuracy, param_digest, run_environment
    from .ddp_setup import make_optimizer
    from .fsdp2_comm_spec import wire_dtype
    from .fsdp2_comms import shard_with
    from .models import build_task

    dtype = reduce_dtype(choice)
    comm = getattr(config, "fsdp2_comm", None)
    nodes = getattr(config, "nodes", 1)
    task = build_task(config.model, config.seed)
    local = copy.deepcopy(task.model)  # unsharded copy: each rank's own gradient, as DDP's probe sees it
    model = task.model
    if comm is None:
        _shard(model, dtype)
    else:
        shard_with(model, comm, dtype, ctx.world_size, nodes)
    compressing = wire_dtype(comm, str(dtype).removeprefix("torch.")) != "float32"
    optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr)
    names = [n for n, _ in local.named_parameters()]
    batches = rank_batches(task.train, ctx.rank, ctx.world_size, config.batch_size, config.seed)
    loss_fn = task.loss_fn()
    counter = PayloadCounter.install()
    steps, layers = [], []
    drift = None  # the sums over steps of h - exact and of exact: cumulative_rel_error
    for step in range(config.steps):
        ctx.heartbeat(step)
        x, y = next(batches)
        with torch.no_grad():  # the copy holds this step's parameters (an all-gather, not counted)
            for p_local, p in zip(local.parameters(), model.parameters()):
                p_local.copy_(_full(p))
        local.zero_grad(set_to_none=True)
        loss_fn(local(x), y).backward()
        g = torch.cat([p.grad.reshape(-1) for p in local.parameters() if p.grad is not None]).double()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        counter.reset()
        wrote = written_bytes()
        counter.active = True
        loss.backward()
        counter.active = False
        wrote_after = written_bytes()
        counted = dict(counter.bytes_by_op), counter.payload_bytes, counter.ring_bytes
        h = torch.cat([_full(p.grad).reshape(-1) for p in model.parameters() if p.grad is not None]).double()
        optimizer.step()
        elapsed = time.perf_counter() - start
        exact = g.clone()
        dist.all_reduce(exact)
        exact /= ctx.world_size
        drift = _add_drift(drift, h, exact)
        total_loss = loss.detach().double().reshape(1)
        dist.all_reduce(total_loss)
        row: dict = {
            "step": step,
            "loss": float(total_loss) / ctx.world_size,
            "payload_bytes": counted[1],
            "ring_bytes": counted[2],
            "uncompressed_bytes": g.numel() * 4,
            "step_time_s": elapsed,
            "wire_bytes": math.nan if wrote is None or wrote_after is None else wrote_after - wrote,
            "compressing": compressing,
            **_errors(h, exact),
            "rank_spread": _rank_spread(h),
            "cumulative_rel_error": float(drift[0].norm() / drift[1].norm()),
            **{f"{op}_bytes": n for op, n in counted[0].items()},
        }
        row["intra_bytes"], row["inter_bytes"] = float(counter.intra_bytes), float(counter.inter_bytes)  # by group
        row["intra_hops"], row["inter_hops"] = counter.intra_hops, counter.inter_hops
        steps.append(row)
        sizes = [p.numel() for p in local.parameters()]
        for name, size, hp, ep in zip(names, sizes, h.split(sizes), exact.split(sizes)):
            layers.append({"step": step, "layer": name, "numel": size, **_errors(hp, ep)})
    with torch.no_grad():  # the trained parameters, whole, for the digest and the test accuracy
        for p_local, p in zip(local.parameters(), model.parameters()):
            p_local.copy_(_full(p))
    digest = param_digest(local)
    if not ctx.is_main:
        return {"rank": ctx.rank, "param_digest": digest}
    final_accuracy = accuracy(local, task.test, ctx.device) if task.test is not None else math.nan
    return {
        "rank": 0,
        "param_digest": digest,
        "steps": steps,
        "layers": layers,
        "notes": [
            f"fsdp2: fully_shard with MixedPrecisionPolicy(reduce_dtype={dtype}); gradients are "
            "reduce-scattered (each rank keeps 1/W of the mean) and parameters all-gathered for forward and backward, "
            "so its bytes per step are not DDP's all-reduce bytes.",
            *([_comm_note(comm)] if comm is not None else []),
        ],
        "sample": None,
        "final": {
            "loss": steps[-1]["loss"],
            "accuracy": final_accuracy,
        },
        "env": {**run_environment(ctx, task), "api": "fsdp2"},
    }

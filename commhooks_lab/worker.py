"""What each rank does in one experiment: build the task, wrap it in DDP, register the hook
inside the probe, train, and measure every step. Returns plain data (rank 0 the tables)."""
from __future__ import annotations

import hashlib
import math
import platform
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from .config import ExperimentConfig
from .data import rank_batches
from .hooks import BATCHED_POWER_SGD_NOTE, BF16_HOOK_NAMES, batched_fix_active, build_hook, registration_refusal
from .models import build_task
from .probe import Probe


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=0.9 if name == "momentum" else 0.0)


def param_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes: equal digests mean bit-identical models."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


@torch.no_grad()
def accuracy(model: torch.nn.Module, dataset, device) -> float:
    x, y = dataset.tensors
    model.eval()
    correct = (model(x.to(device)).argmax(dim=1) == y.to(device)).float().mean().item()
    model.train()
    return correct


def hook_notes(config: ExperimentConfig, choice, hook, refusal: str | None) -> list[str]:
    notes = []
    if refusal is not None:
        which = "bf16" if getattr(hook, "__name__", "") in BF16_HOOK_NAMES else choice.name
        notes.append(
            f"{which}: on this build `ddp_model.register_comm_hook(state, {hook.__name__})` raises {refusal}. "
            "DDP refuses bf16 hooks by name unless PyTorch has CUDA 11+ and NCCL 2.10+ (or XPU with XCCL). "
            "gloo reduces bfloat16 fine, so the lab registered the same arithmetic inside its probe to measure it; "
            "on CUDA with NCCL >= 2.10 your own register_comm_hook call works as written.")
    if choice.is_builtin and choice.hook == "batched_power_sgd" and batched_fix_active():
        notes.append(BATCHED_POWER_SGD_NOTE)
    if choice.is_builtin and choice.hook == "no" and config.probe:
        notes.append("no: DDP's built-in allreduce runs in C++ where Python cannot see it; the probe measured it "
                     "through allreduce_hook, which gives bit-identical gradients.")
    return notes


@dataclass
class Setup:
    """What a training loop needs, however DDP was set up."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    state: Any
    notes: list
    backward: Callable
    batches: Iterator


def setup_torch_ddp(ctx, config: ExperimentConfig, task, probe: Probe, choice) -> Setup:
    """Plain PyTorch: ``DDP(model)`` then ``register_comm_hook(state, hook)``, the hook inside the probe."""
    device_ids = [ctx.device] if ctx.device.type == "cuda" else None
    ddp = DDP(task.model, device_ids=device_ids, bucket_cap_mb=config.bucket_cap_mb)
    hook, state = build_hook(choice)
    refusal = registration_refusal(ddp, hook) if hook is not None else None
    notes = hook_notes(config, choice, hook, refusal)
    register_probed(ddp, probe, hook, state, ctx, config)
    optimizer = make_optimizer(config.optimizer, ddp.parameters(), config.lr)
    data = rank_batches(task.train, ctx.rank, ctx.world_size, config.batch_size, config.seed)
    return Setup(ddp, optimizer, state, notes, torch.Tensor.backward, data)


def register_probed(ddp, probe: Probe, hook, state, ctx, config: ExperimentConfig, register=None) -> None:
    """Register ``hook`` inside the probe; with no hook, measure DDP's allreduce through allreduce_hook."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if hook is None and config.probe:
        hook, state = default_hooks.allreduce_hook, None
    if hook is not None:
        (register or ddp.register_comm_hook)(state, probe.wrap(hook, wait=ctx.backend == "gloo"))


def run_experiment(ctx, config: ExperimentConfig) -> dict:
    """The worker function: train ``config.steps`` steps and measure each one."""
    choice = config.check()
    task = build_task(config.model, config.seed)
    task.model.to(ctx.device)
    probe = Probe(list(task.model.named_parameters()), ctx.world_size, ctx.rank, measure=config.probe)
    if config.api == "accelerate":
        from .accelerate_path import setup_accelerate_ddp

        setup = setup_accelerate_ddp(ctx, config, task, probe, choice)
    else:
        setup = setup_torch_ddp(ctx, config, task, probe, choice)
    loss_fn = task.loss_fn()
    steps, layers = [], []

    def flush() -> None:
        step_rows, layer_rows = probe.flush()
        steps.extend(step_rows)
        layers.extend(layer_rows)

    for step in range(config.steps):
        x, y = (t.to(ctx.device) for t in next(setup.batches))
        start = time.perf_counter()
        setup.optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(setup.model(x), y)
        probe.start_step()
        setup.backward(loss)
        record = probe.end_step(loss)
        setup.optimizer.step()
        record.update(step=step, step_time_s=time.perf_counter() - start)
        if task.test is not None and config.eval_every and (step + 1) % config.eval_every == 0:
            record["accuracy"] = accuracy(task.model, task.test, ctx.device)
        if probe.should_flush():
            flush()
        if ctx.is_main:
            ctx.report(step=step + 1, steps=config.steps, loss_rank0=loss.item())
    flush()
    digest = param_digest(task.model)
    if not ctx.is_main:
        return {"rank": ctx.rank, "param_digest": digest}
    final_accuracy = accuracy(task.model, task.test, ctx.device) if task.test is not None else math.nan
    powersgd_iter = getattr(setup.state, "iter", None)
    sample = probe.sample(config.sample_layer) if config.probe else None
    return {
        "rank": 0, "param_digest": digest, "steps": steps, "layers": layers, "notes": setup.notes, "sample": sample,
        "final": {"loss": steps[-1]["loss"], "accuracy": final_accuracy, "powersgd_iter": powersgd_iter},
        "env": {"torch": torch.__version__, "backend": ctx.backend, "world_size": ctx.world_size,
                "python": platform.python_version(), "device": str(ctx.device),
                "task": task.description},
    }


def run_experiments(ctx, configs: list[ExperimentConfig]) -> list[dict]:
    """Several experiments in one process group (under torchrun, where re-joining is costly)."""
    return [run_experiment(ctx, config) for config in configs]

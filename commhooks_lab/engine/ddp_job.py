"""The per-rank job of one experiment: build the task, set up DDP with the hook inside the probe,
train, and measure every step. Returns plain data (rank 0 the tables)."""

from __future__ import annotations

import hashlib
import math
import platform
import time

import torch

from .._util import quiet_logger
from ..hooks.choice import HookChoice
from ..measure.probe import Probe
from . import compile_progress
from .config import ExperimentConfig
from .ddp_setup import setup_torch_ddp
from .models import build_task

__all__ = ["accuracy", "param_digest", "quiet_dynamo", "run_environment", "ddp_job"]


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


def quiet_dynamo():
    """Hide Dynamo's warning that DDP's profiler ``record_function`` is ignored while tracing (it is harmless
    and every compiled DDP step would print it into the notebook); real errors still raise."""
    return quiet_logger("torch._dynamo")


def ddp_job(ctx, config: ExperimentConfig, choice: HookChoice | None = None) -> dict:
    """The worker function: train ``config.steps`` steps and measure each one.

    ``choice`` is what ``config.check()`` returned in the notebook; it carries the registry
    record, so a hook registered in a notebook cell is built here too.
    """
    choice = config.check(local=False) if choice is None else choice  # the ranks exist already
    if config.compile == "eager":
        return _train(ctx, config, choice)
    import torch._dynamo

    from .. import _compat

    torch._dynamo.reset()  # a warm rank's earlier compiled runs leave no graphs behind
    switch = _compat.optimize_ddp("python_reducer" if config.compile == "compiled_autograd" else "ddp_optimizer")
    with switch, quiet_dynamo(), compile_progress.beating(ctx):
        return _train(ctx, config, choice)


def _train(ctx, config: ExperimentConfig, choice: HookChoice) -> dict:
    task = build_task(config.model, config.seed)
    task.model.to(ctx.device)
    probe = Probe(list(task.model.named_parameters()), ctx.world_size, ctx.rank, measure=config.measure)
    if config.api == "accelerate":
        from .accelerate import setup_accelerate_ddp

        setup = setup_accelerate_ddp(ctx, config, task, probe, choice)
    else:
        setup = setup_torch_ddp(ctx, config, task, probe, choice)
    loss_fn = task.loss_fn()
    steps: list[dict] = []
    layers: list[dict] = []

    def flush(final: bool = False) -> None:
        step_rows, layer_rows = probe.flush(final=final)
        steps.extend(step_rows)
        layers.extend(layer_rows)

    first, nonfinite = 0, None
    if config.resume_from is not None:
        from .resume import resume_rank

        first, steps, layers, notes = resume_rank(ctx, config, setup, task, probe, loss_fn)
        setup.notes.extend(notes)
    for step in range(first, config.steps):
        if step > first or config.compile == "eager":  # compiling the first step is slow, not stuck
            ctx.heartbeat(step)  # a rank that stops here is named in the notebook, with the step
        x, y = (t.to(ctx.device) for t in next(setup.batches))
        start = time.perf_counter()
        setup.optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(setup.model(x), y)
        probe.start_step()
        setup.backward(loss)
        record = probe.end_step(loss)
        setup.optimizer.step()  # a step post-hook (local SGD, DiLoCo) counts its bytes into the step's record
        record.update(step=step, step_time_s=time.perf_counter() - start)
        if nonfinite is None:
            nonfinite = _nonfinite_note(step, loss, task.model, config)
        if ctx.is_main and task.test is not None and config.eval_every and (step + 1) % config.eval_every == 0:
            record["accuracy"] = accuracy(task.model, task.test, ctx.device)  # only rank 0's records are kept
        measured = len(steps)
        if config.live or probe.should_flush() or config.checkpoint_at == step + 1:
            flush(final=False)  # the same numbers whenever it runs: each step is measured on its own
        if config.checkpoint_at == step + 1:
            from .resume import save_checkpoint

            save_checkpoint(ctx, config, step + 1, setup, task, probe, (steps, layers))
        if ctx.is_main:
            live_rows = {"rows": steps[measured:]} if config.live else {}
            ctx.report(step=step + 1, steps=config.steps, loss_rank0=loss.item(), **live_rows)
    flush(final=True)  # the last step's gradients go to rank 0 for the sample
    digest = param_digest(task.model)
    if not ctx.is_main:
        return {"rank": ctx.rank, "param_digest": digest, "link_totals": probe.link_totals}
    final_accuracy = accuracy(task.model, task.test, ctx.device) if task.test is not None else math.nan
    if config.compile == "compiled_autograd":
        setup.notes.append(_uncounted_bytes(steps))
    if nonfinite is not None:
        setup.notes.append(nonfinite)
    powersgd_iter = getattr(setup.state, "iter", None)
    sample = probe.sample(config.sample_layer) if config.measure else None
    return {
        "rank": 0,
        "param_digest": digest,
        "link_totals": probe.link_totals,
        "steps": steps,
        "layers": layers,
        "notes": setup.notes,
        "sample": sample,
        "final": {"loss": steps[-1]["loss"], "accuracy": final_accuracy, "powersgd_iter": powersgd_iter},
        "env": run_environment(ctx, task),
    }


def _nonfinite_note(step: int, loss, model, config: ExperimentConfig) -> str | None:
    """The first sign that training went non-finite (a NaN or an infinite loss or parameter), said once."""
    if not math.isfinite(loss.item()):
        where = f"the loss is {loss.item()} at step {step}"
    else:
        bad = next((name for name, p in model.named_parameters() if not torch.isfinite(p).all()), None)
        if bad is None:
            return None
        where = f"parameter {bad!r} holds a NaN or an infinity after step {step}'s update (the loss was still finite)"
    return (
        f"training went non-finite: {where}. Every later number is meaningless. Causes: a learning rate too large "
        f"(lr={config.lr:g}), or a hook that leaves NaN or inf in the gradients (check its arithmetic)."
    )


#: What the probe counts in the hook; compiled autograd sends through functional collectives it cannot see.
COUNTED = (
    "payload_bytes",
    "ring_bytes",
    "intra_bytes",
    "inter_bytes",
    "intra_hops",
    "inter_hops",
    "allgather_bytes",
    "allgather_calls",
    "collective_calls",
    "uncompressed_bytes",
)


def _uncounted_bytes(steps: list[dict]) -> str:
    """Blank the counted bytes of a compiled-autograd run (they would read 0) and say why."""
    for row in steps:
        row.update(dict.fromkeys(COUNTED, math.nan), compressing=False)
    return (
        "bytes not counted under compiled autograd: DDP's default reduction and PyTorch's fp16/bf16 hooks then send "
        "through functional collectives inside the traced graph, which the lab's counter cannot see; wire_bytes "
        "(what the process wrote, from the OS) still counts."
    )


def run_environment(ctx, task) -> dict:
    """Where a run ran, for its Result: versions, backend, world size, device, task."""
    return {
        "torch": torch.__version__,
        "backend": ctx.backend,
        "world_size": ctx.world_size,
        "python": platform.python_version(),
        "device": str(ctx.device),
        "task": task.description,
    }

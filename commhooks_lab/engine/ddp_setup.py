"""Model, optimizer and hook registration for each way of setting up DDP (plain PyTorch, Accelerate).

Both paths register the chosen hook inside the probe and hand the training loop the same
:class:`Setup`, so the loop in :mod:`commhooks_lab.engine.ddp_job` never asks which path it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import _compat
from ..hooks.choice import HookChoice, build_hook
from ..measure.probe import Probe
from .config import ExperimentConfig
from .data import rank_batches

__all__ = [
    "compiled",
    "hook_notes",
    "make_optimizer",
    "register_probed",
    "Setup",
    "setup_torch_ddp",
    "timing_note",
    "waits_per_bucket",
]


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=0.9 if name == "momentum" else 0.0)


def hook_notes(config: ExperimentConfig, choice: HookChoice, hook, refusal: str | None) -> list[str]:
    """What the learner should know about this run that the numbers alone do not say."""
    notes = []
    if refusal is not None:
        needing = next((e for e in (choice.wrapper_entry, choice.entry) if e is not None and e.needs), None)
        which = needing.name if needing is not None else choice.name
        needs = needing.needs if needing is not None else "another build"
        notes.append(
            f"{which}: on this build `ddp_model.register_comm_hook(state, {hook.__name__})` raises {refusal}. "
            f"DDP refuses this hook by name unless PyTorch has {needs}. gloo runs its arithmetic fine, so the lab "
            f"registered the same function inside its probe to measure it; with {needs} your own "
            "register_comm_hook call works as written."
        )
    if choice.entry is not None and choice.entry.rank_note is not None:
        note = choice.entry.rank_note()
        if note:
            notes.append(note)
    if hook is None and config.measure:
        notes.append(
            "no: DDP's built-in allreduce runs in C++ where Python cannot see it; the probe measured it "
            "through allreduce_hook, which divides the sum by the world size where the reducer multiplies by its "
            "inverse: the same gradients bit for bit when the world size is a power of two, last-bit differences "
            "otherwise."
        )
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


def waits_per_bucket(ctx, config: ExperimentConfig, choice: HookChoice) -> bool:
    """Whether the probe finishes each bucket's communication before DDP goes on (see :meth:`Probe.wrap`).

    Always on gloo, except in a timing run of a hook that starts one collective and returns
    (``HookEntry.overlaps_backward``): no collective of it starts in a ``.then()`` callback, so buckets
    cannot interleave, and DDP overlaps it with backward as it would without the lab.
    """
    if ctx.backend != "gloo":
        return False
    return not (config.timing and choice.entry is not None and choice.entry.overlaps_backward)


def timing_note(config: ExperimentConfig, choice: HookChoice, waits: bool) -> str:
    """Which mode a step time comes from: it says whether the communication could overlap backward."""
    if config.timing and not waits:
        return (
            f"timing: step_time_s is DDP's own, {choice.name} registered as written and each bucket's "
            "communication overlapping backward (no float64 measurement in the step)"
        )
    why = (
        "gloo cannot run the collectives a hook starts in .then() callbacks for two buckets at once, so "
        f"{choice.name} waits for each bucket"
        if config.timing
        else "measuring, the probe waits for each bucket's communication before backward goes on, and copies "
        "every gradient"
    )
    return f"timing: step_time_s includes serialized communication ({why}); DDP could not overlap it with backward"


def register_probed(
    ddp, probe: Probe, hook, state, ctx, config: ExperimentConfig, register=None, wait: bool | None = None
) -> None:
    """Register ``hook`` inside the probe; with no hook, measure DDP's allreduce through allreduce_hook."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if hook is None and config.measure:
        hook, state = default_hooks.allreduce_hook, None
    if hook is not None:
        wait = ctx.backend == "gloo" if wait is None else wait
        (register or ddp.register_comm_hook)(state, probe.wrap(hook, wait=wait))


def setup_torch_ddp(ctx, config: ExperimentConfig, task, probe: Probe, choice: HookChoice) -> Setup:
    """Plain PyTorch: ``DDP(model)`` then ``register_comm_hook(state, hook)``, the hook inside the probe."""
    device_ids = [ctx.device] if ctx.device.type == "cuda" else None
    ddp = DDP(task.model, device_ids=device_ids, bucket_cap_mb=config.bucket_cap_mb)  # reads optimize_ddp
    hook, state = build_hook(choice)
    refusal = _compat.registration_refusal(ddp, hook) if hook is not None else None
    probe.notes.extend(hook_notes(config, choice, hook, refusal))  # the probe adds its own as it measures
    waits = waits_per_bucket(ctx, config, choice)
    if config.link is not None or config.timing:
        probe.notes.append(timing_note(config, choice, waits and (hook is not None or config.measure)))
    register_probed(ddp, probe, hook, state, ctx, config, wait=waits)
    optimizer = make_optimizer(config.optimizer, ddp.parameters(), config.lr)
    data = rank_batches(task.train, ctx.rank, ctx.world_size, config.batch_size, config.seed)
    entry = choice.entry
    if entry is not None and entry.step_post_hook is not None:  # on the optimizer: the loop never knows

        def count(fn: Callable[..., dict]) -> None:  # into the row end_step made for this step
            probe.count_into(probe.records[-1], fn)

        entry.step_post_hook(ddp.module, optimizer, entry.options_with_defaults(choice.options), count)
    if config.compile == "eager":
        return Setup(ddp, optimizer, state, probe.notes, torch.Tensor.backward, data)
    model, backward = compiled(ddp, config.compile)
    return Setup(model, optimizer, state, probe.notes, backward, data)


def compiled(ddp: DDP, mode: str) -> tuple[torch.nn.Module, Callable]:
    """``torch.compile`` the DDP model; under compiled autograd the backward is traced too."""
    from .config import COMPILE_BACKEND

    model = cast(torch.nn.Module, torch.compile(ddp, backend=COMPILE_BACKEND))  # an OptimizedModule
    if mode != "compiled_autograd":
        return model, torch.Tensor.backward

    def backward(loss: torch.Tensor) -> None:
        with _compat.compiled_autograd(torch.compile(backend=COMPILE_BACKEND)):
            loss.backward()

    return model, backward

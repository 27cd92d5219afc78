"""The source document's second form: the same hooks through Accelerate, measured the same way.

Each rank builds ``Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=...,
comm_wrapper=..., comm_state_option=...)])`` and calls ``accelerator.prepare(model, optimizer,
data_loader)`` and ``accelerator.backward(loss)``. The probe measures the hook *Accelerate*
registers: while ``prepare`` runs, ``DistributedDataParallel.register_comm_hook`` is intercepted,
so whatever Accelerate passes is wrapped, not re-created.
"""

from __future__ import annotations

from .._compat import intercept_comm_hook_registration, registration_refusal, reset_accelerate_state
from ..hooks.choice import HookChoice
from ..measure.probe import Probe
from .data import InterleavedBatchSampler, endless
from .ddp_setup import Setup, hook_notes, make_optimizer, register_probed

__all__ = ["_ddp_kwargs", "reset_accelerate_state", "setup_accelerate_ddp"]

SILENT_FALLBACK = (
    "Accelerate did not see a multi-process run (distributed_type={kind}, num_processes={n}): every process "
    "would train alone, with no DDP and no hook. On a machine without GPUs pass Accelerator(cpu=True) or set "
    "ACCELERATE_USE_CPU=1, with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set as torchrun does."
)


def _ddp_kwargs(choice: HookChoice, bucket_cap_mb: float = 25.0):
    """The DistributedDataParallelKwargs a learner would write for this choice."""
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    if choice.entry is None or choice.entry.accelerate is None:
        raise ValueError(f"{choice.name} has no Accelerate form (DDPCommunicationHookType does not name it)")
    wrapper = choice.wrapper_entry.accelerate if choice.wrapper_entry is not None else "no"
    return DistributedDataParallelKwargs(
        comm_hook=DDPCommunicationHookType(choice.entry.accelerate),
        comm_wrapper=DDPCommunicationHookType(wrapper),
        comm_state_option=dict(choice.options),
        bucket_cap_mb=bucket_cap_mb,
    )


def setup_accelerate_ddp(ctx, config, task, probe: Probe, choice: HookChoice) -> Setup:
    """The Accelerate form of :func:`commhooks_lab.engine.ddp_setup.setup_torch_ddp`."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    if choice.entry is not None and choice.entry.prepare is not None:
        choice.entry.prepare()  # e.g. batched PowerSGD's fix, as on the torch path
    reset_accelerate_state()
    accelerator = Accelerator(cpu=ctx.device.type == "cpu", kwargs_handlers=[_ddp_kwargs(choice, config.bucket_cap_mb)])
    if accelerator.distributed_type == DistributedType.NO or accelerator.num_processes != ctx.world_size:
        raise RuntimeError(SILENT_FALLBACK.format(kind=accelerator.distributed_type, n=accelerator.num_processes))
    optimizer = make_optimizer(config.optimizer, task.model.parameters(), config.lr)
    sampler = InterleavedBatchSampler(task.train, ctx.world_size, config.batch_size, config.seed)
    loader = torch.utils.data.DataLoader(task.train, batch_sampler=sampler)
    seen: dict = {}

    def on_register(ddp, state, hook, register):
        seen.update(state=state, hook=hook, refusal=registration_refusal(ddp, hook))
        register_probed(ddp, probe, hook, state, ctx, config, register=register)

    with intercept_comm_hook_registration(on_register):
        model, optimizer, loader = accelerator.prepare(task.model, optimizer, loader)
    if not seen:  # comm_hook=NO: Accelerate registered nothing; measure DDP's allreduce as the torch path does
        register_probed(model, probe, None, None, ctx, config)
    probe.notes.extend(hook_notes(config, choice, seen.get("hook"), seen.get("refusal")))  # the probe adds its own
    return Setup(model, optimizer, seen.get("state"), probe.notes, accelerator.backward, endless(loader))

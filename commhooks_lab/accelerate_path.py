"""The source document's second form: the same hooks through Accelerate, measured the same way.

Each rank builds ``Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=...,
comm_wrapper=..., comm_state_option=...)])`` and calls ``accelerator.prepare(model, optimizer,
data_loader)`` and ``accelerator.backward(loss)``. The probe measures the hook *Accelerate*
registers: while ``prepare`` runs, ``DistributedDataParallel.register_comm_hook`` is intercepted,
so whatever Accelerate passes is wrapped, not re-created.
"""
from __future__ import annotations

import contextlib

from torch.nn.parallel import DistributedDataParallel as DDP

from .data import InterleavedBatchSampler, endless
from .hooks import patch_batched_orthogonalize, registration_refusal
from .probe import Probe

#: The hooks Accelerate's DDPCommunicationHookType names; the lab's others have no Accelerate form.
ACCELERATE_HOOKS = ("no", "fp16", "bf16", "power_sgd", "batched_power_sgd")

SILENT_FALLBACK = (
    "Accelerate did not see a multi-process run (distributed_type={kind}, num_processes={n}): every process "
    "would train alone, with no DDP and no hook. On a machine without GPUs pass Accelerator(cpu=True) or set "
    "ACCELERATE_USE_CPU=1, with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set as torchrun does."
)


@contextlib.contextmanager
def intercept_comm_hook_registration(on_register):
    """While active, ``DDP.register_comm_hook(state, hook)`` calls ``on_register(ddp, state, hook, original)``."""
    original = DDP.register_comm_hook

    def register_comm_hook(self, state, hook):
        return on_register(self, state, hook, lambda s, h: original(self, s, h))

    DDP.register_comm_hook = register_comm_hook
    try:
        yield
    finally:
        DDP.register_comm_hook = original


def ddp_kwargs(choice, bucket_cap_mb: float):
    """The DistributedDataParallelKwargs a learner would write for this choice."""
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    return DistributedDataParallelKwargs(
        comm_hook=DDPCommunicationHookType(choice.hook),
        comm_wrapper=DDPCommunicationHookType(choice.wrapper),
        comm_state_option=dict(choice.options),
        bucket_cap_mb=bucket_cap_mb,
    )


def reset_accelerate_state() -> None:
    """Accelerate keeps process-wide singletons; a warm rank starts each run from scratch."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def setup_accelerate_ddp(ctx, config, task, probe: Probe, choice):
    """The Accelerate form of :func:`commhooks_lab.worker.setup_torch_ddp`."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    from .worker import Setup, hook_notes, make_optimizer, register_probed

    if choice.hook == "batched_power_sgd":
        patch_batched_orthogonalize()
    reset_accelerate_state()
    accelerator = Accelerator(cpu=ctx.device.type == "cpu",
                              kwargs_handlers=[ddp_kwargs(choice, config.bucket_cap_mb)])
    if accelerator.distributed_type == DistributedType.NO or accelerator.num_processes != ctx.world_size:
        raise RuntimeError(SILENT_FALLBACK.format(kind=accelerator.distributed_type, n=accelerator.num_processes))
    optimizer = make_optimizer(config.optimizer, task.model.parameters(), config.lr)
    sampler = InterleavedBatchSampler(task.train, ctx.world_size, config.batch_size, config.seed)
    loader = torch.utils.data.DataLoader(task.train, batch_sampler=sampler)
    seen = {}

    def on_register(ddp, state, hook, register):
        seen.update(state=state, hook=hook, refusal=registration_refusal(ddp, hook))
        register_probed(ddp, probe, hook, state, ctx, config, register=register)

    with intercept_comm_hook_registration(on_register):
        model, optimizer, loader = accelerator.prepare(task.model, optimizer, loader)
    if not seen:  # comm_hook=NO: Accelerate registered nothing; measure DDP's allreduce as the torch path does
        register_probed(model, probe, None, None, ctx, config)
    notes = hook_notes(config, choice, seen.get("hook"), seen.get("refusal"))
    return Setup(model, optimizer, seen.get("state"), notes, accelerator.backward, endless(loader))

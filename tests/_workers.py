"""Worker functions the launcher tests send to real rank processes (imported there by name)."""

import os
import signal
import time

import torch
import torch.distributed as dist


def rank_and_sum(ctx, offset=0.0):
    value = torch.tensor([ctx.rank + 1.0 + offset])
    dist.all_reduce(value)
    ctx.report(stage="reduced", value=value.item())
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "sum": value.item(),
        "pid": os.getpid(),
        "env_rank": os.environ["RANK"],
        "omp": os.environ.get("OMP_NUM_THREADS"),
    }


def raise_on_rank(ctx, bad_rank):
    if ctx.rank == bad_rank:
        raise ValueError(f"boom from rank {ctx.rank}")
    dist.barrier()  # the healthy rank waits for the broken one, as in real training
    return ctx.rank


def exit_on_rank(ctx, bad_rank, code):
    if ctx.rank == bad_rank:
        os._exit(code)
    dist.barrier()
    return ctx.rank


def kill_self_on_rank(ctx, bad_rank):
    if ctx.rank == bad_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return ctx.rank


def skip_collective_on_rank(ctx, bad_rank):
    """One rank never joins the all-reduce: the others wait until the group's timeout."""
    if ctx.rank == bad_rank:
        time.sleep(3600)
    dist.all_reduce(torch.ones(1))
    return ctx.rank


def sleep_forever(ctx):
    time.sleep(3600)


def return_unpicklable(ctx):
    import threading

    return threading.Lock()


def abort_at_teardown(ctx):
    """Deliver a result, then crash in destroy_process_group like the rare gloo SIGABRT at exit."""
    dist.destroy_process_group = lambda *a, **k: os.kill(os.getpid(), signal.SIGABRT)
    return ctx.rank


def pid(ctx):
    return os.getpid()


def my_allreduce_hook(state, bucket):
    """A learner's hook: the plain average, written out."""
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])


def plain_ddp_digest(ctx, hook_name, state_options, steps):
    """The lab's training loop written out in plain PyTorch: no probe, no registry, the hook registered bare.

    Only the task (model + data) and the batch order come from the lab, so that digests can be compared.
    """
    import hashlib

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    from commhooks_lab._compat import patch_batched_orthogonalize
    from commhooks_lab.engine.data import rank_batches
    from commhooks_lab.engine.models import build_task

    task = build_task("mlp", 0)
    model = DDP(task.model, bucket_cap_mb=25.0)
    if hook_name in ("power_sgd", "batched_power_sgd"):
        patch_batched_orthogonalize()  # PyTorch 2.13's batched hook needs it on any machine
        state = powersgd.PowerSGDState(process_group=None, **state_options)
        hook = powersgd.powerSGD_hook if hook_name == "power_sgd" else powersgd.batched_powerSGD_hook
        model.register_comm_hook(state, hook)
    elif hook_name != "no":
        hook = {"allreduce": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook}[hook_name]
        model.register_comm_hook(None, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batches = rank_batches(task.train, ctx.rank, ctx.world_size, 32, 0)
    for _ in range(steps):
        x, y = next(batches)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    digest = hashlib.sha256()
    for p in task.model.parameters():
        digest.update(p.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()

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
    return {"rank": ctx.rank, "world_size": ctx.world_size, "sum": value.item(), "pid": os.getpid(),
            "env_rank": os.environ["RANK"], "omp": os.environ.get("OMP_NUM_THREADS")}


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

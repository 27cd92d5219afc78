"""Hooks the challenge's tests score in-process (the ranks import them by this module's name)."""

import torch
import torch.distributed as dist

#: The extra floats :func:`allreduce_and_broadcast` broadcasts from rank 0 each step.
EXTRA = 1000


def allreduce_and_broadcast(state, bucket):
    """All-reduce, then a broadcast the hook calls itself: its bytes must count (rank 0 sends them)."""
    dist.broadcast(torch.zeros(EXTRA), src=0)
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda done: done.value()[0])


def through_the_process_group(state, bucket):
    """All-reduce through the ProcessGroup method, which the byte counter cannot see: the wire check can."""
    tensor = bucket.buffer().div_(dist.get_world_size())
    work = dist.group.WORLD.allreduce([tensor])
    work.wait()
    future = torch.futures.Future()
    future.set_result(tensor)
    return future

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


def second_rank_leads(process_group):
    """State for :func:`leaders_off_rank_zero`: on 2 nodes of 2, each node's group, and the leaders' group of ranks
    1 and 3, made on every rank in the same order (as ``new_group`` needs)."""
    nodes = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    return {"node": nodes[dist.get_rank() // 2], "leaders": dist.new_group([1, 3])}


def leaders_off_rank_zero(state, bucket):
    """A node's sum goes to its SECOND rank, which alone talks between nodes: rank 0 sends nothing across, so a
    model fed rank 0's counts alone would call this hook free between nodes."""
    rank, leader = dist.get_rank(), dist.get_rank() // 2 * 2 + 1
    tensor = bucket.buffer().div_(dist.get_world_size())
    dist.reduce(tensor, dst=leader, group=state["node"])
    if rank == leader:
        dist.all_reduce(tensor, group=state["leaders"])
    dist.broadcast(tensor, src=leader, group=state["node"])
    future = torch.futures.Future()
    future.set_result(tensor)
    return future

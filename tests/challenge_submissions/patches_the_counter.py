"""Cheat: swaps the counted all_reduce for the uncounted ProcessGroup method, so its bytes never count."""

import torch.distributed as dist

dist.all_reduce = lambda tensor, *args, **kwargs: dist.group.WORLD.allreduce([tensor])


def hook(state, bucket):
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda done: done.value()[0])

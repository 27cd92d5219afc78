"""A fair entry: fp16 on the wire, written by hand with a collective the hook calls itself."""

import torch
import torch.distributed as dist


def hook(state, bucket):
    halved = bucket.buffer().to(torch.float16).div_(dist.get_world_size())
    future = dist.all_reduce(halved, async_op=True).get_future()
    return future.then(lambda done: bucket.buffer().copy_(done.value()[0]))

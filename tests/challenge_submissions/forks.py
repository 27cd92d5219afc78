"""Cheat: forks a helper that outlives the run."""

import os
import time

import torch.distributed as dist

if os.fork() == 0:
    time.sleep(3600)


def hook(state, bucket):
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda done: done.value()[0])

"""Cheat: leaves a file for another submission to find."""

import torch.distributed as dist

with open("/tmp/hook_challenge_was_here", "w") as f:
    f.write("rank notes")


def hook(state, bucket):
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda done: done.value()[0])

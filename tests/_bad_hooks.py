"""Hooks that break DDP's contract the way learners do (run in real ranks by test_hook_contract.py)."""

import torch
import torch.distributed as dist


def returns_the_tensor(state, bucket):
    """Forgot the future: hands DDP the tensor itself."""
    return bucket.buffer()


def callback_returns_nothing(state, bucket):
    def divide(fut):
        bucket.buffer().copy_(fut.value()[0]).div_(dist.get_world_size())  # no return

    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(divide)


def returns_half_the_bucket(state, bucket):
    half = bucket.buffer()[: bucket.buffer().numel() // 2]
    return dist.all_reduce(half, async_op=True).get_future().then(lambda fut: fut.value()[0])


def returns_the_raw_future(state, bucket):
    """The future of an async collective holds a list of tensors, not the tensor."""
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future()


def returns_float16(state, bucket):
    compressed = bucket.buffer().to(torch.float16)
    return dist.all_reduce(compressed, async_op=True).get_future().then(lambda fut: fut.value()[0])

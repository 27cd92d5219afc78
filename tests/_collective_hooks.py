"""Hooks that each make one torch.distributed call of known size (run in real ranks by test_payload.py).

Every call moves ``X`` = 100 float32 = 400 bytes per tensor; each hook then hands DDP the bucket
unchanged (the bytes are the point here, not the gradient). Written for two ranks.
"""

import warnings

import torch
import torch.distributed as dist

N = 100  # elements per tensor: 400 bytes


def x() -> torch.Tensor:
    return torch.ones(N)


def done(bucket) -> torch.futures.Future:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def peer() -> int:
    return 1 - dist.get_rank()


def all_reduce_positional(state, bucket):
    dist.all_reduce(x())
    return done(bucket)


def all_reduce_keyword(state, bucket):
    dist.all_reduce(tensor=x(), op=dist.ReduceOp.SUM)
    return done(bucket)


def all_reduce_positional_group(state, bucket):
    """``state`` is a group of rank 0 alone: W = 1 there, so nothing goes on the wire."""
    dist.all_reduce(x(), dist.ReduceOp.SUM, state)
    return done(bucket)


def group_of_rank0(process_group=None):
    return dist.new_group([0])


def all_reduce_async_in_callback(state, bucket):
    """The collective starts in a .then() callback, on gloo's thread: still counted."""

    def then_again(fut):
        dist.all_reduce(x(), async_op=True).get_future().wait()  # as PowerSGD's callbacks do
        return bucket.buffer()

    return dist.all_reduce(x(), async_op=True).get_future().then(then_again)


def all_reduce_coalesced(state, bucket):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_reduce_coalesced([x(), x()])
    return done(bucket)


def all_gather(state, bucket):
    dist.all_gather([torch.empty(N) for _ in range(2)], x())
    return done(bucket)


def all_gather_keyword(state, bucket):
    dist.all_gather(tensor_list=[torch.empty(N) for _ in range(2)], tensor=x())
    return done(bucket)


def all_gather_single(state, bucket):
    dist.all_gather_single(torch.empty(2 * N), x())
    return done(bucket)


def all_gather_into_tensor(state, bucket):
    """A deprecated wrapper of all_gather_single: counted once, under its own name."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_into_tensor(torch.empty(2 * N), x())
    return done(bucket)


def all_gather_coalesced(state, bucket):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_coalesced([[torch.empty(N)] for _ in range(2)], [x()])
    return done(bucket)


def all_gather_object(state, bucket):
    """Not patched itself: its two inner all_gather calls (sizes, then pickled bytes) are what count."""
    dist.all_gather_object([None, None], "abc")
    return done(bucket)


def reduce_scatter(state, bucket):
    dist.reduce_scatter(torch.empty(N), [x(), x()])
    return done(bucket)


def reduce_scatter_single(state, bucket):
    dist.reduce_scatter_single(torch.empty(N), torch.ones(2 * N))
    return done(bucket)


def reduce_scatter_tensor(state, bucket):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.reduce_scatter_tensor(torch.empty(N), torch.ones(2 * N))
    return done(bucket)


def all_to_all(state, bucket):
    dist.all_to_all([torch.empty(N) for _ in range(2)], [x(), x()])
    return done(bucket)


def all_to_all_single(state, bucket):
    dist.all_to_all_single(torch.empty(2 * N), torch.ones(2 * N))
    return done(bucket)


def all_to_all_single_uneven(state, bucket):
    """Rank 0 keeps 30 of its 200 elements and sends 170; rank 1 keeps 150 and sends 50."""
    rank = dist.get_rank()
    inputs, outputs = ([30, 170], [30, 50]) if rank == 0 else ([50, 150], [170, 150])
    dist.all_to_all_single(torch.empty(sum(outputs)), torch.ones(2 * N), outputs, inputs)
    return done(bucket)


def broadcast_from_0(state, bucket):
    dist.broadcast(x(), src=0)
    return done(bucket)


def broadcast_from_1(state, bucket):
    dist.broadcast(x(), 1)
    return done(bucket)


def reduce_to_0(state, bucket):
    dist.reduce(x(), dst=0)
    return done(bucket)


def reduce_to_1(state, bucket):
    dist.reduce(x(), 1)
    return done(bucket)


def gather_to_0(state, bucket):
    gather_list = [torch.empty(N) for _ in range(2)] if dist.get_rank() == 0 else None
    dist.gather(x(), gather_list, dst=0)
    return done(bucket)


def gather_to_1(state, bucket):
    gather_list = [torch.empty(N) for _ in range(2)] if dist.get_rank() == 1 else None
    dist.gather(x(), gather_list=gather_list, dst=1)
    return done(bucket)


def scatter_from_0(state, bucket):
    scatter_list = [x(), x()] if dist.get_rank() == 0 else None
    dist.scatter(torch.empty(N), scatter_list, src=0)
    return done(bucket)


def scatter_from_1(state, bucket):
    scatter_list = [x(), x()] if dist.get_rank() == 1 else None
    dist.scatter(torch.empty(N), scatter_list=scatter_list, src=1)
    return done(bucket)


def send_from_0(state, bucket):
    if dist.get_rank() == 0:
        dist.send(x(), 1)
    else:
        dist.recv(torch.empty(N), 0)  # recv calls irecv inside: counted once, as recv
    return done(bucket)


def send_from_1(state, bucket):
    if dist.get_rank() == 1:
        dist.send(tensor=x(), dst=0)
    else:
        dist.recv(tensor=torch.empty(N), src=1)
    return done(bucket)


def isend_irecv(state, bucket):
    """Both ranks send 400 bytes to the other and receive 400: the receive counts 0."""
    works = [dist.isend(x(), peer()), dist.irecv(torch.empty(N), peer())]
    for work in works:
        work.wait()
    return done(bucket)


def batch_isend_irecv(state, bucket):
    ops = [dist.P2POp(dist.isend, x(), peer()), dist.P2POp(dist.irecv, torch.empty(N), peer())]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return done(bucket)


def through_the_process_group(state, bucket):
    """A collective the counter cannot see: a ProcessGroup method. wire_bytes can."""
    tensor = bucket.buffer().div_(dist.get_world_size())
    dist.group.WORLD.allreduce([tensor]).wait()
    return done(bucket)


def compressor_hook_on_meta_default(state, bucket):
    """The lab's compressor hook with a meta default device: any tensor it made without device= would be meta."""
    from commhooks_lab.hooks.compressors import compressor_hook

    with torch.device("meta"):
        return compressor_hook(state, bucket)

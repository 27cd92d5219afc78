"""Worker functions and hooks for the launcher's failure tests (the ranks import them by name)."""

import os
import signal
import threading
import time

import torch
import torch.distributed as dist


def write_to_stderr_then_die(ctx, bad_rank, lines, how):
    """Write numbered lines straight to fd 2 (as C++ would), then die without a Python exception."""
    if ctx.rank == bad_rank:
        for i in range(lines):
            os.write(2, f"stderr line {i} from rank {ctx.rank}\n".encode())
        if how == "signal":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(7)
    dist.barrier()
    return ctx.rank


def report_from_a_callback_and_the_main_thread(ctx, n, size):
    """Report ``n`` events from a gloo callback thread while the main thread reports ``n`` more."""
    blob = bytes(range(256)) * (size // 256)  # over 16 KiB: send_bytes writes header and body apart
    in_callback = threading.Event()

    def callback(fut):
        in_callback.set()
        for i in range(n):
            ctx.report(source="callback", i=i, blob=blob, thread=threading.get_ident())
        return fut.value()

    if ctx.rank == 1:
        time.sleep(1.0)  # rank 0's collective cannot finish before its callback is attached: gloo runs it
    done = dist.all_reduce(torch.ones(1), async_op=True).get_future().then(callback)
    assert in_callback.wait(30), "the collective's callback never ran"
    for i in range(n):
        ctx.report(source="main", i=i, blob=blob, thread=threading.get_ident())
    done.wait()
    return threading.get_ident()


def stop_beating_on_rank(ctx, bad_rank, stop_at, steps):
    """A training loop with heartbeats in which one rank stops before reaching step ``stop_at``."""
    for step in range(steps):
        if ctx.rank == bad_rank and step == stop_at:
            time.sleep(3600)
        ctx.heartbeat(step)
        dist.all_reduce(torch.ones(1))
    return ctx.rank


def return_early_on_rank(ctx, bad_rank, steps):
    """One rank runs one step fewer than the others and returns: they wait for it in the last step."""
    for step in range(steps - (ctx.rank == bad_rank)):
        ctx.heartbeat(step)
        dist.all_reduce(torch.ones(1))
    return ctx.rank


_calls = [0]


def hang_on_rank_1_at_step_2(state, bucket):
    """An allreduce hook in which rank 1 stops at its third call (step 2 of a one-bucket model)."""
    if dist.get_rank() == 1 and _calls[0] == 2:
        time.sleep(3600)
    _calls[0] += 1
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])


def beat_slowly(ctx, steps, seconds):
    """A run longer than its timeout that keeps sending heartbeats."""
    for step in range(steps):
        ctx.heartbeat(step)
        time.sleep(seconds)
        dist.all_reduce(torch.ones(1))
    return steps


_skip_calls = [0]


def skip_on_rank_1_at_step_2(state, bucket):
    """An allreduce hook that, on rank 1 only, leaves out its collective at its third call (step 2)."""
    call = _skip_calls[0]
    _skip_calls[0] += 1
    tensor = bucket.buffer().div_(dist.get_world_size())
    if dist.get_rank() == 1 and call == 2:
        fut = torch.futures.Future()
        fut.set_result(tensor)
        return fut
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])


def never_complete(state, bucket):
    """A hook whose Future is never completed: DDP waits for it forever, on every rank, outside any collective."""
    return torch.futures.Future()


def length_of(ctx, blob):
    """The size of a (large) argument: the task itself is the test."""
    return len(blob)


def kill_the_rank_server(ctx):
    """Rank 0 kills the process that forked it (the rank server), then waits to be taken down with it."""
    if ctx.rank == 0:
        os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)
    return ctx.rank


def allocate_on_rank_1(ctx, mib):
    """Rank 1 touches ``mib`` MiB of memory (its cgroup's limit decides whether it survives)."""
    if ctx.rank == 1:
        block = bytearray(mib * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
    dist.barrier()
    return ctx.rank


def nan_hook(state, bucket):
    """An allreduce hook that leaves NaN in every gradient."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer().fill_(float("nan")))
    return fut


def sum_in_a_new_group(ctx):
    """A new process group meets through the store (the rendezvous file) again."""
    group = dist.new_group(list(range(ctx.world_size)))
    total = torch.ones(1)
    dist.all_reduce(total, group=group)
    return total.item()


def busy_then_answer(ctx, seconds, every_s, speak):
    """A rank busy for ``seconds`` with no step to report (as while compiling), saying it is alive or not."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if speak:
            ctx.alive()
        time.sleep(every_s)
    return "done"

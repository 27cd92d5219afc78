"""What every rank process runs: join the process group, then serve tasks from the parent.

Kept import-light (torch and cloudpickle only) because each spawned rank imports it before
it can do anything. Messages travel over one private pipe per rank as pickled bytes, so a
result is data (never printed text) and a dead rank can never hold a shared lock.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

# Message kinds, child -> parent.
READY, EVENT, RESULT, ERROR = "ready", "event", "result", "error"
# Message kinds, parent -> child.
RUN, STOP = "run", "stop"


@dataclass
class WorkerContext:
    """Handed to every worker function as its first argument: who am I, and how to report."""

    rank: int
    world_size: int
    backend: str
    device: Any  # torch.device
    local_rank: int = 0
    _sink: Callable[[dict], None] | None = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def report(self, **event: Any) -> None:
        """Send a progress event (small, picklable values) to the parent's ``on_event``."""
        if self._sink is not None:
            self._sink(event)


def error_payload(exc: BaseException) -> dict:
    """Describe an exception as plain data: the exception object itself may not unpickle."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


def _send(conn, message: tuple) -> None:
    import cloudpickle

    try:
        data = cloudpickle.dumps(message)
    except Exception as exc:  # an unpicklable result must not kill the rank silently
        kind, rank, _ = message
        wrapped = TypeError(f"rank {rank} produced a {kind} that cannot be pickled: {exc}")
        data = pickle.dumps((ERROR, rank, error_payload(wrapped)))
    conn.send_bytes(data)


def _exit_when_orphaned(poll_s: float = 0.5) -> None:
    """Leave at once if the parent dies (kernel killed, SIGKILL): no orphans, ever."""
    parent = os.getppid()
    try:  # Linux: let the kernel deliver SIGKILL when the parent goes.
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(poll_s)

    threading.Thread(target=watch, name="commhooks-orphan-watch", daemon=True).start()


def init_process_group(rank: int, world_size: int, backend: str, store, timeout_s: float):
    """Join the group and pick this rank's device (one CUDA device per rank under NCCL)."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
    )
    return device


def worker_main(rank: int, world_size: int, backend: str, store_port: int, timeout_s: float, conn) -> None:
    """Entry point of one rank started by :class:`commhooks_lab.Cluster`."""
    import signal

    # A kernel interrupt reaches the whole process group; the parent decides what happens.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_when_orphaned()
    try:
        import cloudpickle
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        # What torchrun would set, so code written for a real cluster finds its bearings.
        os.environ.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(store_port),
            }
        )
        store = dist.TCPStore("127.0.0.1", store_port, world_size, False, timedelta(seconds=timeout_s))
        device = init_process_group(rank, world_size, backend, store, timeout_s)
        ctx = WorkerContext(
            rank, world_size, backend, device, local_rank=rank, _sink=lambda event: _send(conn, (EVENT, rank, event))
        )
        _send(conn, (READY, rank, None))
    except BaseException as exc:
        _send(conn, (ERROR, rank, error_payload(exc)))
        return
    while True:
        try:
            kind, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # parent went away
            break
        if kind == STOP:
            break
        try:
            fn, args = cloudpickle.loads(payload)
            value = fn(ctx, *args)
        except BaseException as exc:
            _send(conn, (ERROR, rank, error_payload(exc)))
        else:
            _send(conn, (RESULT, rank, value))
    dist.destroy_process_group()
    conn.close()
    # Every result is delivered. Skip C++ static destructors: a joinable gloo thread destroyed
    # there aborts the process now and then ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

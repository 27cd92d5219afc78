"""What every rank process runs: join the process group, then serve tasks from the parent.

Kept import-light (torch and cloudpickle only) because each spawned rank imports it before
it can do anything. Messages travel over one private pipe per rank as pickled bytes, so a
result is data (never printed text) and a dead rank can never hold a shared lock. Within a
rank one lock guards the pipe: a hook's ``.then()`` callback reports from gloo's threads.
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

from .collective_log import CollectiveLog
from .rank_spec import RankSpec

__all__ = ["init_process_group", "worker_main", "WorkerContext"]

# Message kinds, child -> parent.
READY, EVENT, HEARTBEAT, RESULT, ERROR = "ready", "event", "heartbeat", "result", "error"
#: "Busy, not stuck" (compiling): it extends the silence timeout without claiming a step, so no stall is reported.
ALIVE = "alive"
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
    _beat: Callable[[int], None] | None = field(default=None, repr=False)
    _alive: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def report(self, **event: Any) -> None:
        """Send a progress event (small, picklable values) to the parent's ``on_event``; any thread may call it."""
        if self._sink is not None:
            self._sink(event)

    def heartbeat(self, step: int) -> None:
        """Tell the notebook this rank has reached ``step`` (every rank, every step: a few bytes).

        When ranks stop making progress the notebook says which rank is behind, and a hang ends
        in a ``WorkerTimeoutError`` naming the rank the others waited for and the step.
        Does nothing under torchrun, where no notebook is listening.
        """
        if self._beat is not None:
            self._beat(int(step))

    def alive(self) -> None:
        """Tell the notebook this rank is busy but not stuck (compiling, say): the run's silence timeout starts
        again, and no step is claimed, so the notebook reports no rank as behind. Nothing under torchrun."""
        if self._alive is not None:
            self._alive()


def _error_payload(exc: BaseException, log: CollectiveLog | None = None) -> dict:
    """Describe an exception as plain data: the exception object itself may not unpickle."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "collectives": log.snapshot() if log is not None else None,
    }


class Channel:
    """This rank's end of its pipe to the parent, safe to use from any thread.

    ``Connection.send_bytes`` writes a large message in several ``write`` calls; without the
    lock a report from a gloo callback thread could land in the middle of the main thread's.
    """

    def __init__(self, conn, rank: int):
        self.conn = conn
        self.rank = rank
        self._lock = threading.Lock()
        self.collectives = CollectiveLog()  # sent with an error: did this rank leave a collective out?

    def send(self, kind: str, payload: Any) -> None:
        import cloudpickle

        try:
            data = cloudpickle.dumps((kind, self.rank, payload))
        except Exception as exc:  # an unpicklable result must not kill the rank silently
            wrapped = TypeError(f"rank {self.rank} produced a {kind} that cannot be pickled: {exc}")
            data = pickle.dumps((ERROR, self.rank, _error_payload(wrapped)))
        self._send_bytes(data)

    def alive(self) -> None:
        self._send_bytes(pickle.dumps((ALIVE, self.rank, None)))

    def heartbeat(self, step: int) -> None:
        self.collectives.beat(step)
        self._send_bytes(pickle.dumps((HEARTBEAT, self.rank, step)))

    def _send_bytes(self, data: bytes) -> None:
        with self._lock:
            self.conn.send_bytes(data)


def _exit_when_orphaned(poll_s: float = 0.5) -> None:
    """Leave at once if the parent dies (kernel killed, SIGKILL): no orphans, ever.

    The parent is the process that asked for this rank: the notebook's kernel, whose end of a pipe
    (multiprocessing's parent sentinel) closes when it dies. Under the rank server, ``getppid`` is
    the server, which outlives the kernel while any rank it forked is alive.
    """
    import multiprocessing
    from multiprocessing.connection import wait

    parent = os.getppid()
    asker = multiprocessing.parent_process()
    sentinel = asker.sentinel if asker is not None else None
    try:  # Linux: let the kernel deliver SIGKILL when the process that forked us goes.
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            if sentinel is None:
                time.sleep(poll_s)
            elif wait([sentinel], poll_s):
                os._exit(1)

    threading.Thread(target=watch, name="commhooks-orphan-watch", daemon=True).start()


def init_process_group(rank: int, world_size: int, backend: str, store, timeout_s: float):
    """Join the group and pick this rank's device (the same rule as under torchrun)."""
    import torch.distributed as dist

    from .devices import backend_and_device

    backend, device = backend_and_device(backend, local_rank=rank)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
    )
    return device


def worker_main(
    spec: RankSpec, rank: int, store_path: str, conn, stderr_path: str | None = None, environ: dict | None = None
) -> None:
    """Entry point of one rank started by :class:`commhooks_lab.Cluster`: rank ``rank`` of the ranks ``spec`` says.

    ``store_path``: the FileStore the ranks meet in (:class:`~.store.PrivateRendezvous`). ``environ``: the
    whole environment this rank must see (a rank forked by the rank server inherited the server's; spawned
    ranks copied the notebook's already). ``spec.link``: a :class:`~.link_spec.Link` to sit behind; the rank was
    forked inside the private network, and makes its own namespace and link first of all (on its node's switch,
    where ``spec.topology`` groups the ranks into nodes: ``LOCAL_RANK`` and ``GROUP_RANK`` then say where).
    """
    import signal

    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    if stderr_path is not None:
        from .rank_logs import redirect_own_stderr

        redirect_own_stderr(stderr_path)  # already so under spawn and fork; not under forkserver
    # A kernel interrupt reaches the whole process group; the parent decides what happens.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_when_orphaned()
    channel = Channel(conn, rank)
    try:
        topology = spec.topology
        if topology is not None and topology.uplink is not None:
            from .netns_switch import join_node

            # gloo's only way out of this rank's namespace, onto its node's switch
            os.environ["GLOO_SOCKET_IFNAME"] = join_node(topology, rank, os.path.dirname(store_path))
        elif spec.link is not None:
            from .netns_switch import join

            os.environ["GLOO_SOCKET_IFNAME"] = join(spec.link)  # gloo's only way out of this rank's namespace
        import cloudpickle
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        channel.collectives.install()
        # What torchrun would set, so code written for a real cluster finds its bearings (there is no
        # MASTER_PORT: the group exists already, and its store is a file, not a port).
        world_size, timeout_s = spec.world_size, spec.timeout_s
        local_rank = rank if topology is None else topology.local_rank(rank)
        os.environ.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(local_rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size if topology is None else topology.ranks_per_node),
                "GROUP_RANK": str(0 if topology is None else topology.node_of(rank)),  # torchrun's node rank
                "MASTER_ADDR": "127.0.0.1",
            }
        )
        os.environ.pop("MASTER_PORT", None)
        store = dist.FileStore(store_path, world_size)
        store.set_timeout(timedelta(seconds=timeout_s))
        device = init_process_group(rank, world_size, spec.backend, store, timeout_s)
        ctx = WorkerContext(
            rank,
            world_size,
            spec.backend,
            device,
            local_rank=local_rank,
            _sink=lambda event: channel.send(EVENT, event),
            _beat=channel.heartbeat,
            _alive=channel.alive,
        )
        channel.send(READY, None)
    except BaseException as exc:
        channel.send(ERROR, _error_payload(exc))
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
            channel.send(ERROR, _error_payload(exc, channel.collectives))
        else:
            channel.send(RESULT, value)
    if dist.is_initialized():  # a task (a %%ddp cell) may have destroyed it already: that is reported there
        dist.destroy_process_group()
    if spec.link is not None:
        from .netns_switch import leave

        leave()
    conn.close()
    # Every result is delivered. Skip C++ static destructors: a joinable gloo thread destroyed
    # there aborts the process now and then ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

"""A set of live DDP rank processes that a notebook can hand work to again and again.

Starting ranks costs seconds (``import torch`` plus rendezvous); a step costs milliseconds.
A :class:`Cluster` pays the start once, keeps the process group alive, and on any failure
tears everything down so the next run starts clean. ``launch`` is a one-shot Cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

from . import rank_process
from .errors import RankFailure, WorkerError, WorkerTimeoutError
from .options import check_launch_options

log = logging.getLogger("commhooks_lab")

EventCallback = Callable[[int, dict], None]

#: How long to keep listening after the first failure, so the root cause wins over echoes
#: (a peer's "connection closed" error usually follows the real failure by milliseconds).
FAILURE_GRACE_S = 0.5
#: The wall-clock watchdog fires this long after ``timeout_s``, so that the process group's own
#: timeout (``timeout_s``) reports first and can name the rank that never joined a collective.
WATCHDOG_MARGIN_S = 2.0
#: How long ranks get to leave after ``stop`` before they are terminated.
SHUTDOWN_GRACE_S = 5.0

_env_lock = threading.Lock()


def _loopback_interface() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in names if n.startswith("lo")), None)


def child_environment(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Variables the ranks must see *before* they import torch.

    One thread per rank makes gloo's reductions bit-reproducible (``torch.set_num_threads``
    does not reach gloo's callback threads) and avoids oversubscribing a laptop's cores.
    """
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    loopback = _loopback_interface()
    if loopback and "GLOO_SOCKET_IFNAME" not in os.environ:
        env["GLOO_SOCKET_IFNAME"] = loopback  # hostnames that resolve off-machine break gloo
    env.update(overrides or {})
    return env


@contextlib.contextmanager
def _patched_environ(env: dict[str, str]):
    """Spawned children copy ``os.environ`` at start; set ours just for that moment."""
    with _env_lock:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def serialize_task(fn: Callable, args: tuple) -> bytes:
    """Pickle ``fn`` by value where needed (a function defined in a notebook cell) and its args."""
    import cloudpickle

    if not callable(fn):
        raise TypeError(f"fn must be callable as fn(ctx, *args), got {type(fn).__name__}")
    try:
        return cloudpickle.dumps((fn, tuple(args)))
    except Exception as exc:
        raise TypeError(
            f"cannot send {getattr(fn, '__name__', fn)!r} and its arguments to the worker processes: {exc}. "
            "Pass plain data (numbers, strings, tensors, dataclasses), not open files, locks or processes."
        ) from exc


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name} ({exitcode})"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


_COMM_ECHO = ("connection closed", "connection reset", "broken pipe", "gloo", "nccl", "timed out")


def _is_echo(f: RankFailure) -> bool:
    """A communication error that only reflects another rank's failure (a peer hung up, timed out)."""
    return f.how == "raised" and any(s in f.summary.lower() for s in _COMM_ECHO)


def _root_cause_first(failures: list[RankFailure]) -> list[RankFailure]:
    """Order failures: real exceptions, then deaths, then echoes; the lower rank breaks ties
    (arrival order would make the same failure read differently from run to run)."""
    return sorted(failures, key=lambda f: (2 if _is_echo(f) else (1 if f.how == "died" else 0), f.rank))


def _shutdown(procs: list, conns: list, store_holder: list, graceful: bool) -> list[str]:
    """Stop the ranks (politely if ``graceful``), reap them all, and report teardown crashes."""
    notes = []
    if graceful:
        for conn in conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send_bytes(pickle.dumps((rank_process.STOP, None)))
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(2.0)
        if p.is_alive():
            p.kill()
            p.join(2.0)
    if graceful:
        for rank, p in enumerate(procs):
            if p.exitcode not in (0, None):
                notes.append(
                    f"rank {rank} {_describe_exit(p.exitcode)} during teardown, after it had delivered "
                    "all its results: nothing was lost"
                )
    for conn in conns:
        conn.close()
    for p in procs:
        with contextlib.suppress(ValueError):
            p.close()
    store_holder.clear()
    procs.clear()
    conns.clear()
    for note in notes:
        log.info(note)
    return notes


class Cluster:
    """``world_size`` live DDP ranks on this machine; ``run(fn, *args)`` calls ``fn(ctx, *args)`` on each.

    Use it as a context manager, or keep one in a notebook and ``close()`` it (it also closes
    itself on garbage collection and at interpreter exit). After a worker error the ranks are
    torn down and the next ``run`` starts fresh ones.
    """

    def __init__(
        self,
        world_size: int = 2,
        *,
        backend: str | None = None,
        timeout_s: float = 120.0,
        start_method: str = "spawn",
        env: dict[str, str] | None = None,
    ):
        self.backend = check_launch_options(world_size, backend, timeout_s, start_method)
        self.world_size = int(world_size)
        self.timeout_s = float(timeout_s)
        self.start_method = start_method
        self.env = child_environment(env)
        self.teardown_notes: list[str] = []
        self.starts = 0
        self._procs: list = []
        self._conns: list = []
        self._store: list = []
        self._finalizer: weakref.finalize | None = None
        self.start()

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def start(self) -> None:
        """Start the ranks and wait until every one has joined the process group."""
        if self.alive:
            return
        self._stop(graceful=False)
        import torch.distributed as dist
        import torch.multiprocessing as mp

        # The parent hosts the rendezvous store on a port the OS picks: no collisions between
        # re-run cells or two kernels, and no race between choosing a port and binding it.
        store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=self.timeout_s), wait_for_workers=False)
        self._store.append(store)
        mp_ctx: Any = mp.get_context(self.start_method)
        with _patched_environ(self.env):
            for rank in range(self.world_size):
                parent_end, child_end = mp_ctx.Pipe(duplex=True)
                proc = mp_ctx.Process(
                    target=rank_process.worker_main,
                    args=(rank, self.world_size, self.backend, store.port, self.timeout_s, child_end),
                    name=f"commhooks-rank{rank}",
                    daemon=True,
                )
                self._procs.append(proc)
                self._conns.append(parent_end)
                proc.start()
                child_end.close()
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns, self._store, True)
        self.starts += 1
        try:
            self._collect(rank_process.READY, self.timeout_s, None)
        except BaseException:
            self._stop(graceful=False)
            raise

    def _stop(self, graceful: bool) -> None:
        if self._finalizer is not None and self._finalizer.alive:
            self._finalizer.detach()
            self.teardown_notes += _shutdown(self._procs, self._conns, self._store, graceful)
        self._finalizer = None

    def close(self) -> None:
        """Stop every rank and reap it; safe to call twice."""
        self._stop(graceful=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "alive" if self.alive else "stopped"
        return f"Cluster(world_size={self.world_size}, backend={self.backend!r}, {state}, pids={self.pids})"

    # -- work --------------------------------------------------------------------------
    def run(
        self, fn: Callable, *args: Any, timeout_s: float | None = None, on_event: EventCallback | None = None
    ) -> list:
        """Run ``fn(ctx, *args)`` on every rank; return the ranks' return values in rank order."""
        return self.run_serialized(serialize_task(fn, args), timeout_s=timeout_s, on_event=on_event)

    def run_serialized(
        self, payload: bytes, *, timeout_s: float | None = None, on_event: EventCallback | None = None
    ) -> list:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if not timeout > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.start()
        try:
            message = pickle.dumps((rank_process.RUN, payload))
            for conn in self._conns:
                conn.send_bytes(message)
            return self._collect(rank_process.RESULT, timeout, on_event)
        except BaseException:  # a worker error, a timeout, or the kernel interrupted us
            self._stop(graceful=False)
            raise

    def _collect(self, expected: str, timeout_s: float, on_event: EventCallback | None) -> list:
        """Wait for one ``expected`` message per rank, forwarding events; raise on any failure."""
        results: list = [None] * self.world_size
        pending = set(range(self.world_size))
        failures: list[RankFailure] = []
        deadline = time.monotonic() + timeout_s + WATCHDOG_MARGIN_S
        grace_until = None

        def handle(rank: int, data: bytes) -> None:
            kind, _, payload = pickle.loads(data)
            if kind == rank_process.EVENT:
                if on_event is not None:
                    on_event(rank, payload)
            elif kind == expected:
                results[rank] = payload
                pending.discard(rank)
            elif kind == rank_process.ERROR:
                failures.append(
                    RankFailure(rank, "raised", f"raised {payload['type']}: {payload['message']}", payload["traceback"])
                )
                pending.discard(rank)

        while pending:
            now = time.monotonic()
            if failures:
                grace_until = grace_until or now + FAILURE_GRACE_S
                if now >= grace_until:
                    break
            if now >= deadline:
                hung = sorted(pending)
                failure = RankFailure(
                    hung[0],
                    "timeout",
                    f"gave no answer within timeout_s={timeout_s:g} s (ranks without an answer: "
                    f"{hung}); a rank that never joins a collective hangs the others",
                )
                raise WorkerTimeoutError(failure, failures)
            until = min(deadline, grace_until) if grace_until else deadline
            by_conn = {self._conns[r]: r for r in pending}
            by_sentinel = {self._procs[r].sentinel: r for r in pending}
            for obj in wait(list(by_conn) + list(by_sentinel), timeout=max(0.0, until - now)):
                if obj in by_conn:
                    rank = by_conn[obj]
                    if rank in pending:
                        try:
                            handle(rank, obj.recv_bytes())  # type: ignore[union-attr]
                        except (EOFError, OSError):
                            pass  # the sentinel reports the death
                else:
                    rank = by_sentinel[obj]
                    conn = self._conns[rank]
                    with contextlib.suppress(EOFError, OSError):
                        while rank in pending and conn.poll():
                            handle(rank, conn.recv_bytes())
                    if rank in pending:
                        proc = self._procs[rank]
                        proc.join(1.0)
                        failures.append(RankFailure(rank, "died", f"{_describe_exit(proc.exitcode)} while working"))
                        pending.discard(rank)
        if failures:
            first, *others = _root_cause_first(failures)
            if _is_echo(first) and pending:  # the silent rank is the culprit, not the one that gave up
                silent = sorted(pending)
                raise WorkerTimeoutError(
                    RankFailure(
                        silent[0],
                        "timeout",
                        f"gave no answer (ranks without an answer: {silent}) while rank {first.rank} gave up "
                        "waiting for it in a collective: a rank that never joins a collective hangs the others",
                    ),
                    [first, *others],
                )
            raise WorkerError(first, others)
        return results

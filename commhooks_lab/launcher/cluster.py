"""A set of live DDP rank processes that a notebook can hand work to again and again.

Starting ranks costs seconds (``import torch`` plus rendezvous); a step costs milliseconds.
A :class:`Cluster` pays the start once, keeps the process group alive, and on any failure
tears everything down so the next run starts clean. ``launch`` is a one-shot Cluster.
While it waits it watches the ranks' heartbeats, says in the notebook which rank is behind,
and turns a hang into an error naming the rank the others waited for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import sys
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from . import forensics, isolation, rank_process, rank_server
from .environment import child_environment, patched_environ
from .errors import RankFailure
from .limits import thread_refused_cause
from .link_spec import Link
from .oom import oom_kills
from .options import DEFAULT_START_METHOD, DEFAULT_TIMEOUT_S, check_environment, check_timeout
from .rank_logs import RankLog, stderr_into
from .rank_spec import RankSpec
from .step_watch import StepWatch
from .store import PrivateRendezvous

__all__ = ["Cluster", "EventCallback", "log", "serialize_task", "STALL_REPORT_S", "WATCHDOG_MARGIN_S"]

log = logging.getLogger("commhooks_lab")

EventCallback = Callable[[int, dict], None]

#: How long to keep listening after the first failure, so the root cause wins over echoes
#: (a peer's "connection closed" error usually follows the real failure by milliseconds).
FAILURE_GRACE_S = 0.5
#: The wall-clock watchdog fires this long after ``timeout_s`` (plus the longest step seen: a
#: step's collective starts that long after its heartbeat), so that the process group's own
#: timeout reports first and the rank that never joined a collective can be named.
WATCHDOG_MARGIN_S = 5.0
#: The longest the notebook waits on its ranks without looking up (for a pending Ctrl-C).
INTERRUPT_CHECK_S = 0.25
#: How long ranks get to leave after ``stop`` before they are terminated.
SHUTDOWN_GRACE_S = 5.0
#: Starting ranks (``import torch`` in each, on a busy laptop) may take longer than a short lesson timeout.
START_TIMEOUT_S = 60.0
#: While ranks make no progress, say so in the notebook this often.
STALL_REPORT_S = 10.0


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


class _Delivery:
    """The task, written to every rank's pipe at once from threads of its own, so no wait is unbounded.

    A rank that does not read (stopped, frozen) fills its pipe, and a large task then blocks the writer; written
    from here the watchdog still runs, and the rank is named when it fires.
    """

    def __init__(self, conns: list, message: bytes):
        self._lock = threading.Lock()
        self._unsent = set(range(len(conns)))
        self._threads = [
            threading.Thread(target=self._send, args=(rank, conn, message), name=f"commhooks-send{rank}", daemon=True)
            for rank, conn in enumerate(conns)
        ]
        for thread in self._threads:
            try:
                thread.start()
            except RuntimeError as exc:  # "can't start new thread": under ulimit -u, name the limit
                cause = thread_refused_cause(str(exc))
                if not cause:
                    raise
                raise RuntimeError(f"could not start a thread to send the ranks their task: {cause}") from exc

    def _send(self, rank: int, conn, message: bytes) -> None:
        try:
            conn.send_bytes(message)
        except (OSError, ValueError):  # the rank died, or we stopped it: the sentinel says which
            return
        except TypeError:  # stopped between multiprocessing's two writes (length, body): the second had no handle
            if not conn.closed:
                raise
            return
        with self._lock:
            self._unsent.discard(rank)

    def unsent(self) -> list[int]:
        with self._lock:
            return sorted(self._unsent)


def _start_helpers(start_method: str) -> None:
    """Start multiprocessing's helper processes now, so they never inherit a rank's stderr file."""
    if start_method == "fork":
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


def _say(line: str) -> None:
    """Progress while waiting, printed by the caller's (the notebook's) own thread."""
    print(line, file=sys.stderr, flush=True)


def _shutdown(procs: list, conns: list, store_holder: list, logs: list, graceful: bool) -> list[str]:
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
                last = logs[rank].tail(1) if rank < len(logs) else ""
                said = f' (its last words on stderr: "{last.strip()}")' if last.strip() else ""
                notes.append(
                    f"rank {rank} {forensics.describe_exit(p.exitcode)} during teardown, after it had delivered "
                    f"all its results: nothing was lost{said}"
                )
    for conn in conns:
        conn.close()
    for p in procs:
        with contextlib.suppress(ValueError):
            p.close()
    for log_file in logs:
        log_file.remove()
    for rendezvous in store_holder:
        rendezvous.close()
    store_holder.clear()
    procs.clear()
    conns.clear()
    logs.clear()
    for note in notes:
        log.info(note)
    return notes


class Cluster:
    """``world_size`` live DDP ranks on this machine; ``run(fn, *args)`` calls ``fn(ctx, *args)`` on each.

    Use it as a context manager, or keep one in a notebook and ``close()`` it (it also closes
    itself on garbage collection and at interpreter exit). After a worker error the ranks are
    torn down and the next ``run`` starts fresh ones.

    ``start_method``: "forkserver" (the default on Linux; spawn elsewhere) forks the ranks from
    the lab's rank server, a fresh interpreter with torch already imported
    (:mod:`~commhooks_lab.launcher.rank_server`); "spawn" starts each rank as a new interpreter
    (seconds slower, nothing shared); "fork" copies this process (unsafe in a threaded kernel).
    """

    def __init__(
        self,
        world_size: int | RankSpec = 2,
        *,
        backend: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        start_method: str = DEFAULT_START_METHOD,
        env: dict[str, str] | None = None,
        link: str | Link | None = None,
        nodes: int = 1,
        intra_link: str | Link | None = None,
    ):
        """``Cluster(2, link="100mbit")``, ``Cluster(4, nodes=2, link="100mbit")`` (ranks 0-1 and 2-3 on a node each,
        each node behind one 100 Mbit/s uplink), or ``Cluster(spec)`` with a :class:`~.rank_spec.RankSpec`."""
        #: Which ranks these are (checked when it was made): the session's key, and what each rank receives.
        self.spec = as_rank_spec(world_size, backend, timeout_s, link, start_method, nodes, intra_link)
        #: Do the ranks share a private network no other account can reach (:mod:`.isolation`)? A link implies it.
        self.private = self.spec.link is not None or isolation.isolates(self.backend, self.spec.start_method)
        self.env = child_environment(check_environment(env))
        self.teardown_notes: list[str] = []
        self.starts = 0
        self._procs: list = []
        self._conns: list = []
        self._store: list = []
        self._logs: list[RankLog] = []
        self._server: rank_server.RankServer | None = None
        self._finalizer: weakref.finalize | None = None
        # One run at a time: two threads writing to the same pipes would interleave their messages.
        self._turn = threading.Lock()
        self._oom_before: int | None = None  # the OOM killer's count when the current wait began
        self.start()

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    @property
    def backend(self) -> str:
        return self.spec.backend

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
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns, self._store, self._logs, True)
        self.starts += 1
        try:
            # The ranks meet in a file in a folder only this account can enter: no socket another
            # local user (or the network) could reach, no collisions between re-run cells or two kernels.
            rendezvous = PrivateRendezvous()
            self._store.append(rendezvous)
            if self.spec.start_method == "forkserver":
                self._start_forked(rendezvous.path)
            else:
                self._start_processes(rendezvous.path)
            self._collect(rank_process.READY, max(self.spec.timeout_s, START_TIMEOUT_S), None)
            for rank_log in self._logs:
                rank_log.detach()  # every rank holds its stderr file open now
        except BaseException:
            self._stop(graceful=False)
            raise

    def _add_rank(self, rank: int, store: str, mp_ctx: Any, process_class: Any, environ: dict | None, start) -> None:
        """One rank: its pipe and log, the process, ``start(proc, rank_log)``; kept only once it started."""
        parent_end, child_end = mp_ctx.Pipe(duplex=True)
        rank_log = RankLog(rank)
        self._logs.append(rank_log)
        proc = process_class(
            target=rank_process.worker_main,
            args=(self.spec, rank, store, child_end, rank_log.path, environ),
            name=f"commhooks-rank{rank}",
            daemon=True,
        )
        try:
            start(proc, rank_log)
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()
        self._procs.append(proc)
        self._conns.append(parent_end)

    def _start_forked(self, store: str) -> None:
        """Fork every rank from the rank server; each rank sets the environment it is handed."""
        import multiprocessing

        environ = {**os.environ, **self.env}
        self._server = rank_server.server_for(environ, hosts_network=self.private)
        timeout_s = max(self.spec.timeout_s, START_TIMEOUT_S)
        for rank in range(self.world_size):
            self._add_rank(
                rank,
                store,
                multiprocessing,
                rank_server.RankProcess,
                environ,
                lambda proc, _log: rank_server.start(proc, self._server, timeout_s),
            )

    def _start_processes(self, store: str) -> None:
        """Spawn (or fork) every rank; each inherits our environment and fd 2, both patched for the moment."""
        import torch.multiprocessing as mp

        mp_ctx: Any = mp.get_context(self.spec.start_method)
        _start_helpers(self.spec.start_method)

        def start(proc, rank_log: RankLog) -> None:
            with stderr_into(rank_log.path):  # from its first instruction: bootstrap errors too
                proc.start()

        with patched_environ(self.env):
            for rank in range(self.world_size):
                self._add_rank(rank, store, mp_ctx, mp_ctx.Process, None, start)

    def _stop(self, graceful: bool) -> None:
        if self._finalizer is not None and self._finalizer.alive:
            self._finalizer.detach()
            self.teardown_notes += _shutdown(self._procs, self._conns, self._store, self._logs, graceful)
        self._finalizer = None

    def sibling(self) -> Cluster:
        """Another set of ranks made like this one (its spec and environment), started now: its runs give the same
        numbers as this one's."""
        return Cluster(self.spec, env=self.env)

    def close(self) -> None:
        """Stop every rank and reap it; safe to call twice."""
        self._stop(graceful=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "alive" if self.alive else "stopped"
        link = f", link={self.spec.link.spec!r}" if self.spec.link is not None else ""
        if self.spec.nodes > 1:
            link += f", nodes={self.spec.nodes}"
        if self.spec.intra_link is not None:
            link += f", intra_link={self.spec.intra_link.spec!r}"
        return f"Cluster(world_size={self.world_size}, backend={self.backend!r}{link}, {state}, pids={self.pids})"

    # -- work --------------------------------------------------------------------------
    def run(
        self, fn: Callable, *args: Any, timeout_s: float | None = None, on_event: EventCallback | None = None
    ) -> list:
        """Run ``fn(ctx, *args)`` on every rank; return the ranks' return values in rank order."""
        return self.run_serialized(serialize_task(fn, args), timeout_s=timeout_s, on_event=on_event)

    def run_serialized(
        self, payload: bytes, *, timeout_s: float | None = None, on_event: EventCallback | None = None
    ) -> list:
        timeout = self.spec.timeout_s if timeout_s is None else check_timeout(timeout_s)  # the spec's is checked
        with self._turn:  # a second thread's run waits here for this one to end (as a second cell would)
            return self._run_turn(payload, timeout, on_event)

    def _run_turn(self, payload: bytes, timeout: float, on_event: EventCallback | None) -> list:
        self.start()
        try:
            delivery = _Delivery(self._conns, pickle.dumps((rank_process.RUN, payload)))
            return self._collect(rank_process.RESULT, timeout, on_event, delivery)
        except BaseException:  # a worker error, a timeout, or the kernel interrupted us
            self._stop(graceful=False)
            raise

    def _collect(
        self, expected: str, timeout_s: float, on_event: EventCallback | None, delivery: _Delivery | None = None
    ) -> list:
        """Wait for one ``expected`` message per rank, forwarding events; raise on any failure."""
        try:
            return self._wait_for(expected, timeout_s, on_event, delivery)
        finally:
            for rank_log in self._logs:
                rank_log.forward()  # what the ranks printed reaches our stderr, as it would unredirected
            if self._server is not None:
                self._server.log.forward()

    def _wait_for(
        self, expected: str, timeout_s: float, on_event: EventCallback | None, delivery: _Delivery | None
    ) -> list:
        self._oom_before = oom_kills()
        waiting = _Waiting(self.world_size, expected, on_event)
        phase = "starting" if expected == rank_process.READY else "working"
        unsent = delivery.unsent if delivery is not None else list
        grace_until = None
        while waiting.pending:
            now = time.monotonic()
            # A rank that shows progress (heartbeats, events) keeps the run alive: timeout_s bounds silence.
            deadline = waiting.deadline(timeout_s)
            if waiting.failures:
                grace_until = grace_until or now + FAILURE_GRACE_S
                if now >= grace_until:
                    break
            if now >= deadline:
                silent = sorted(waiting.pending)
                raise forensics.silence(waiting.watch, silent, timeout_s, waiting.failures, self.world_size, unsent())
            # Wake up often: to say which rank is behind, and because Ctrl-C that lands on another thread of the
            # kernel does not interrupt this wait (Python raises it only when the main thread runs again).
            until = min(deadline, grace_until or deadline, now + INTERRUPT_CHECK_S)
            self._receive(waiting, max(0.0, until - now), phase)
            if not waiting.failures:
                stall = waiting.watch.stall_message(time.monotonic(), STALL_REPORT_S, timeout_s)
                if stall:
                    _say(stall)
        if waiting.failures:
            raise forensics.failed(
                waiting.failures,
                waiting.watch,
                sorted(waiting.pending),
                timeout_s,
                self.world_size,
                unsent(),
                [r.folder for r in self._store],
            )
        return waiting.results

    def _receive(self, waiting: _Waiting, timeout: float, phase: str) -> None:
        """What the pending ranks send within ``timeout``; a rank whose process ended is reported as a death."""
        by_conn = {self._conns[r]: r for r in waiting.pending}
        by_sentinel = {self._procs[r].sentinel: r for r in waiting.pending}
        for obj in wait(list(by_conn) + list(by_sentinel), timeout=timeout):
            if obj in by_conn:
                rank = by_conn[obj]
                if rank in waiting.pending:
                    with contextlib.suppress(EOFError, OSError):  # the sentinel reports the death
                        waiting.handle(rank, obj.recv_bytes())  # type: ignore[union-attr]
                continue
            rank = by_sentinel[obj]
            conn = self._conns[rank]
            with contextlib.suppress(EOFError, OSError):
                while rank in waiting.pending and conn.poll():
                    waiting.handle(rank, conn.recv_bytes())
            if rank in waiting.pending:
                log = self._logs[rank] if rank < len(self._logs) else None
                proc = self._procs[rank]
                waiting.failures.append(forensics.death(rank, proc, log, self._server, phase, self._oom_before))
                waiting.pending.discard(rank)


class _Waiting:
    """One wait for every rank's ``expected`` message: the values come in, the failures, the signs of life."""

    def __init__(self, world_size: int, expected: str, on_event: EventCallback | None):
        self.expected, self.on_event = expected, on_event
        self.results: list = [None] * world_size
        self.pending = set(range(world_size))
        self.failures: list[RankFailure] = []
        self.watch = StepWatch(world_size)
        self.last_sign_of_life = time.monotonic()

    def deadline(self, timeout_s: float) -> float:
        """When the watchdog fires: ``timeout_s`` of silence, its margin, and the longest step seen."""
        return self.last_sign_of_life + timeout_s + WATCHDOG_MARGIN_S + self.watch.longest_step_s

    def handle(self, rank: int, data: bytes) -> None:
        kind, _, payload = pickle.loads(data)
        self.last_sign_of_life = time.monotonic()
        if kind == rank_process.HEARTBEAT:
            self.watch.beat(rank, payload, self.last_sign_of_life)
        elif kind == rank_process.ALIVE:
            pass  # busy, not stuck: the time of this message is all it says
        elif kind == rank_process.EVENT:
            if self.on_event is not None:
                self.on_event(rank, payload)
        elif kind == self.expected:
            self.results[rank] = payload
            self.pending.discard(rank)
            self.watch.finished(rank)
        elif kind == rank_process.ERROR:
            self.failures.append(
                RankFailure(
                    rank,
                    "raised",
                    f"raised {payload['type']}: {payload['message']}",
                    payload["traceback"],
                    collectives=payload.get("collectives"),
                    detail=thread_refused_cause(payload["message"]),
                )
            )
            self.pending.discard(rank)


def as_rank_spec(
    world_size: int | RankSpec,
    backend: str | None,
    timeout_s: float,
    link: str | Link | None,
    start_method: str,
    nodes: int = 1,
    intra_link: str | Link | None = None,
) -> RankSpec:
    """A :class:`RankSpec` as given, or made from the separate options (a spec and options at once are refused)."""
    if not isinstance(world_size, RankSpec):
        return RankSpec(world_size, backend, timeout_s, link, start_method, nodes, intra_link)
    options = (backend, timeout_s, link, start_method, nodes, intra_link)
    if options != (None, DEFAULT_TIMEOUT_S, None, DEFAULT_START_METHOD, 1, None):
        raise TypeError(
            "pass a RankSpec or the options (backend=, timeout_s=, link=, start_method=, nodes=, intra_link=), not both"
        )
    return world_size

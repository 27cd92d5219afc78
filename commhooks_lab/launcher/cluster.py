"""A set of live DDP rank processes that a notebook can hand work to again and again.

Starting ranks costs seconds (``import torch`` plus rendezvous); a step costs milliseconds.
A :class:`Cluster` pays the start once, keeps the process group alive, and on any failure
tears everything down so the next run starts clean. ``launch`` is a one-shot Cluster.
While it waits it watches the ranks' heartbeats, says in the notebook which rank is behind,
and turns a hang into an error naming the rank the others waited for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from . import isolation, rank_process, rank_server
from .collective_log import left_out
from .environment import child_environment, patched_environ
from .errors import OtherRankFailed, RankFailure, WorkerError, WorkerTimeoutError, explain_death
from .limits import process_limit_cause, thread_refused_cause
from .link_spec import Link
from .oom import killed_for_memory, oom_kills
from .options import DEFAULT_TIMEOUT_S, check_common_options, check_environment, check_launch_options, check_link
from .rank_logs import RankLog, stderr_into
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
    if f.how == "raised" and f.summary.startswith(f"raised {OtherRankFailed.__name__}:"):
        return True
    return f.how == "raised" and any(s in f.summary.lower() for s in _COMM_ECHO)


def _root_cause_first(failures: list[RankFailure]) -> list[RankFailure]:
    """Order failures: real exceptions, then deaths, then echoes; the lower rank breaks ties
    (arrival order would make the same failure read differently from run to run)."""
    return sorted(failures, key=lambda f: (2 if _is_echo(f) else (1 if f.how == "died" else 0), f.rank))


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


def _not_reading(ranks: list[int], timeout_s: float, failures: list[RankFailure]) -> WorkerTimeoutError:
    summary = (
        f"never took its task: {timeout_s:g} s after the run began its pipe was still full, so the process is not "
        "reading (stopped with SIGSTOP or Ctrl-Z, frozen, or swapped out)"
        + (f"; also not reading: ranks {ranks[1:]}" if len(ranks) > 1 else "")
    )
    others = _root_cause_first(failures) if failures else None
    return WorkerTimeoutError(RankFailure(ranks[0], "timeout", summary), others)


def _left_out(failures: list[RankFailure], timed_out: frozenset, world_size: int) -> WorkerTimeoutError | None:
    """Every rank timed out in a collective, and one's collectives stopped following its own last step: that one."""
    if len(timed_out) < world_size:
        return None
    logs = {f.rank: f.collectives for f in failures if f.rank in timed_out and f.collectives}
    culprits = left_out(logs)
    if not culprits:
        return None
    log = logs[culprits[0]]
    others = _ranks_text(r for r in range(world_size) if r not in culprits)
    summary = (
        f"fell out of step with the others' collectives (by step {log['step']} it called {log['current'][:4]} where "
        f"its step before began {log['previous'][:4]}, while {others} kept to the pattern and waited): a rank that "
        "leaves out or adds a collective, such as a hook that skips one on some ranks, pairs every later one wrongly "
        "until gloo's timeout"
    )
    rest = [f for f in failures if f.rank != culprits[0]]
    return WorkerTimeoutError(RankFailure(culprits[0], "timeout", summary, step=log["step"]), rest)


def _ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


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
                    f"rank {rank} {_describe_exit(p.exitcode)} during teardown, after it had delivered "
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
        world_size: int = 2,
        *,
        backend: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        start_method: str = rank_server.DEFAULT_START_METHOD,
        env: dict[str, str] | None = None,
        link: str | Link | None = None,
    ):
        self.backend = check_launch_options(world_size, backend, timeout_s, start_method)
        self.link = check_link(link, start_method, self.backend)
        #: Do the ranks share a private network no other account can reach (:mod:`.isolation`)? A link implies it.
        self.private = self.link is not None or isolation.isolates(self.backend, start_method)
        self.world_size = int(world_size)
        self.timeout_s = float(timeout_s)
        self.start_method = start_method
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
            if self.start_method == "forkserver":
                self._start_forked(rendezvous.path)
            else:
                self._start_processes(rendezvous.path)
            self._collect(rank_process.READY, max(self.timeout_s, START_TIMEOUT_S), None)
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
            args=(
                rank,
                self.world_size,
                self.backend,
                store,
                self.timeout_s,
                child_end,
                rank_log.path,
                environ,
                self.link,
            ),
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
        timeout_s = max(self.timeout_s, START_TIMEOUT_S)
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

        mp_ctx: Any = mp.get_context(self.start_method)
        _start_helpers(self.start_method)

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
        """Another set of ranks made like this one (world size, backend, timeout, link, start method, environment),
        started now: its runs give the same numbers as this one's."""
        return Cluster(
            self.world_size,
            backend=self.backend,
            timeout_s=self.timeout_s,
            start_method=self.start_method,
            env=self.env,
            link=self.link,
        )

    def close(self) -> None:
        """Stop every rank and reap it; safe to call twice."""
        self._stop(graceful=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "alive" if self.alive else "stopped"
        link = f", link={self.link.spec!r}" if self.link is not None else ""
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
        timeout = self.timeout_s if timeout_s is None else timeout_s
        check_common_options(self.world_size, None, timeout)
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
        results: list = [None] * self.world_size
        pending = set(range(self.world_size))
        self._oom_before = oom_kills()
        failures: list[RankFailure] = []
        watch = StepWatch(self.world_size)
        last_sign_of_life = time.monotonic()
        grace_until = None
        phase = "starting" if expected == rank_process.READY else "working"

        def handle(rank: int, data: bytes) -> None:
            nonlocal last_sign_of_life
            kind, _, payload = pickle.loads(data)
            last_sign_of_life = time.monotonic()
            if kind == rank_process.HEARTBEAT:
                watch.beat(rank, payload, last_sign_of_life)
            elif kind == rank_process.ALIVE:
                pass  # busy, not stuck: the time of this message is all it says
            elif kind == rank_process.EVENT:
                if on_event is not None:
                    on_event(rank, payload)
            elif kind == expected:
                results[rank] = payload
                pending.discard(rank)
                watch.finished(rank)
            elif kind == rank_process.ERROR:
                failures.append(
                    RankFailure(
                        rank,
                        "raised",
                        f"raised {payload['type']}: {payload['message']}",
                        payload["traceback"],
                        collectives=payload.get("collectives"),
                        detail=thread_refused_cause(payload["message"]),
                    )
                )
                pending.discard(rank)

        while pending:
            now = time.monotonic()
            # A rank that shows progress (heartbeats, events) keeps the run alive: timeout_s bounds silence.
            deadline = last_sign_of_life + timeout_s + WATCHDOG_MARGIN_S + watch.longest_step_s
            if failures:
                grace_until = grace_until or now + FAILURE_GRACE_S
                if now >= grace_until:
                    break
            if now >= deadline:
                unsent = delivery.unsent() if delivery is not None else []
                if unsent:
                    raise _not_reading(unsent, timeout_s, failures)
                raise self._hang(watch, sorted(pending), timeout_s, failures, watchdog=True)
            until = min(deadline, grace_until) if grace_until else deadline
            # Wake up often: to say which rank is behind, and because Ctrl-C that lands on another thread of the
            # kernel does not interrupt this wait (Python raises it only when the main thread runs again).
            until = min(until, now + INTERRUPT_CHECK_S)
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
                        failures.append(self._death(rank, phase))
                        pending.discard(rank)
            if not failures:
                stall = watch.stall_message(time.monotonic(), STALL_REPORT_S, timeout_s)
                if stall:
                    _say(stall)
        if failures:
            first, *others = _root_cause_first(failures)
            unsent = delivery.unsent() if delivery is not None else []
            if unsent and _is_echo(first):  # the others gave up waiting for a rank that never got its task
                raise _not_reading(unsent, timeout_s, failures)
            if _is_echo(first):  # a rank gave up waiting in a collective: name the one it waited for
                hang = self._hang(watch, sorted(pending), timeout_s, failures, watchdog=False)
                if hang is not None:
                    raise hang
            raise WorkerError(self._rendezvous_gone(first), others)
        return results

    def _rendezvous_gone(self, failure: RankFailure) -> RankFailure:
        """``failure``, explained if the ranks' rendezvous folder was removed under them (their store then fails
        with a bare "No such file or directory")."""
        gone = [r.folder for r in self._store if not os.path.isdir(r.folder)]
        if not gone or failure.detail:
            return failure
        detail = (
            f"the ranks' rendezvous folder {gone[0]} was removed while they ran (by hand, or a temp-folder cleaner), "
            "and their store's file with it; the next run starts new ranks with a new one"
        )
        return dataclasses.replace(failure, detail=detail)

    def _death(self, rank: int, phase: str) -> RankFailure:
        """A rank that ended without a Python exception: how, and what it last wrote to stderr."""
        proc = self._procs[rank]
        proc.join(1.0)
        tail = self._logs[rank].tail() if rank < len(self._logs) else ""
        if not tail and self._server is not None:  # it died before it took its own stderr: the server has it
            tail = self._server.log.tail()
        summary = f"{_describe_exit(proc.exitcode)} while {phase}"
        explanation = explain_death(tail)
        if explanation:
            summary += ", before it could run your code"
        elif self._server is not None and self._server_died():
            explanation = (
                f"the rank server (pid {self._server.pid}) that forked it died first, and a rank leaves with its "
                "server; the next run starts a new server (start_method='spawn' needs none)"
            )
        elif proc.exitcode == -signal.SIGKILL:
            for_memory, counted = killed_for_memory(self._oom_before)
            explanation = (
                f"{counted}: this rank was most likely the one killed, for memory. Use a smaller model or batch, "
                "fewer ranks, or close other programs; in a container, raise its memory limit"
                if for_memory
                else f"something outside the lab sent SIGKILL ({counted})"
                if counted
                else ""
            )
        explanation = explanation or process_limit_cause()  # gloo aborts a rank it could not give its threads
        return RankFailure(rank, "died", summary, stderr_tail=tail, detail=explanation)

    def _server_died(self, settle_s: float = 0.5) -> bool:
        """Did the rank server die? Asked for a moment: its ranks can notice before it is a zombie we can see."""
        assert self._server is not None
        deadline = time.monotonic() + settle_s
        while self._server.running():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def _hang(self, watch: StepWatch, silent: list[int], timeout_s: float, failures: list, *, watchdog: bool):
        """The error for ranks that stopped making progress (None if nothing points at a rank)."""
        timed_out = frozenset(f.rank for f in failures if _is_echo(f))
        skipped = _left_out(failures, timed_out, self.world_size)
        if skipped is not None:
            return skipped
        cause = process_limit_cause()  # the real cause, where the hang is the process limit's doing
        verdict = watch.verdict(silent, timeout_s, timed_out)
        if verdict is not None:
            listed = f" (ranks the others waited for: {verdict.ranks})" if len(verdict.ranks) > 1 else ""
            summary = verdict.summary + listed
            failure = RankFailure(verdict.ranks[0], "timeout", summary, step=verdict.step, detail=cause)
            return WorkerTimeoutError(failure, _root_cause_first(failures) if failures else None)
        if not silent:
            return None
        where = f" (every rank had reached step {max(watch.reached.values())})" if watch.active else ""
        if watchdog:
            summary = (
                f"gave no answer within timeout_s={timeout_s:g} s (ranks without an answer: {silent}){where}; "
                "a rank that never joins a collective hangs the others"
            )
            return WorkerTimeoutError(RankFailure(silent[0], "timeout", summary, detail=cause), failures)
        first = _root_cause_first(failures)[0]
        summary = (
            f"gave no answer (ranks without an answer: {silent}) while rank {first.rank} gave up "
            f"waiting for it in a collective{where}: a rank that never joins a collective hangs the others"
        )
        failure = RankFailure(silent[0], "timeout", summary, detail=cause)
        return WorkerTimeoutError(failure, _root_cause_first(failures))

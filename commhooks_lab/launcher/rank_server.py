"""A fork server preloaded with torch: ranks start in a fork's time, never forked from a threaded kernel.

'spawn' starts every rank as a new interpreter that imports torch (seconds on a laptop); 'fork'
copies the kernel, whose threads (ZMQ, OpenMP) can deadlock the child. This is Python's own
forkserver, started with exec (a fresh interpreter, so its only threads are ones it makes), told to
import torch and the rank code once (``set_forkserver_preload``); every rank is then forked from it.
The package starts one when it is imported in a notebook or script (see :func:`prewarm`), so torch
is usually loaded by the time the first run asks for ranks.

Environment: a forked rank inherits the *server's* environment, not the notebook's. Variables read
when torch or a math library loads (``OMP_NUM_THREADS``, ...) are the server's identity: a Cluster
that needs other values gets a server of its own. Every other variable is set in the rank after the
fork from the notebook's ``os.environ`` at that moment, as under spawn.

Ranks are not handed the notebook's ``__main__`` (spawn re-imports the script you ran in every
rank): functions from a cell or a script travel by value, so a script without a main guard works.
Uses multiprocessing's private forkserver pieces (``ForkServer``, ``popen_forkserver.Popen``);
``tests/multiprocess/test_rank_server.py`` checks them on the running Python.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
import threading
import warnings
from multiprocessing import context, forkserver, popen_forkserver, process, spawn
from multiprocessing.connection import wait
from typing import Any

from .environment import PREWARM_VARIABLE, child_environment, import_time_part, patched_environ
from .netns_switch import HOST_VARIABLE
from .options import DEFAULT_START_METHOD
from .rank_logs import RankLog, stderr_into

__all__ = [
    "default_server",
    "DEFAULT_START_METHOD",
    "preload",
    "prewarm",
    "RankProcess",
    "RankServer",
    "RankServerError",
    "server_for",
    "start",
    "stop_all",
    "why_not_prewarm",
]

#: What the server imports once, before it forks any rank (a module that fails to import is skipped).
#: ``torch._dynamo``: DistributedDataParallel imports it when it wraps a model (most of a second).
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch._dynamo",
    "cloudpickle",
    "commhooks_lab.launcher.rank_process",
    __name__,
)
#: How long a rank may wait for the server to fork it (the first time: until the server has imported torch).
FORK_TIMEOUT_S = 120.0

_lock = threading.Lock()
_preload: list[str] = list(PRELOAD)
_servers: dict[tuple, RankServer] = {}
#: The module a server that hosts the private network imports first (it enters the namespaces).
NETWORK_HOST = "commhooks_lab.launcher.netns_preload"
_owner = os.getpid()
_launching = threading.local()
_util: Any = multiprocessing.util  # private helpers typeshed does not list
_reduction: Any = context.reduction  # type: ignore[attr-defined]


class RankServerError(RuntimeError):
    """The rank server exited or hung before it forked a rank."""


class RankServer(forkserver.ForkServer):
    """One forkserver with a fixed environment, its stderr in a file the Cluster forwards after each run.

    ``hosts_network``: the server enters the ranks' private network before it imports anything else
    (:mod:`.netns_preload`), so the ranks it forks can each get a link of their own (:mod:`.netns_switch`).
    """

    def __init__(self, env: dict[str, str], hosts_network: bool = False):
        super().__init__()
        self.hosts_network = hosts_network
        self.env = {**env, HOST_VARIABLE: "1"} if hosts_network else dict(env)
        self.set_forkserver_preload([NETWORK_HOST] * hosts_network + list(_preload))
        self.log = RankLog("server")
        self._start_lock = threading.Lock()

    def ensure_running(self) -> None:
        """Start the server if it is not running (returns at once: it imports torch in the background)."""
        with self._start_lock:
            if not self.running():
                self.restart()

    def restart(self) -> None:
        """Start the server if ``ForkServer`` finds it gone (it reaps a dead one); a new one gets a new log."""
        if self.pid is not None:
            self.log.remove()
            self.log = RankLog("server")
        with patched_environ(self.env), stderr_into(self.log.path):
            super().ensure_running()
        self.log.detach()  # the server holds it open now

    def running(self) -> bool:
        """Is the server alive? Asked without reaping it (``ForkServer.ensure_running`` reaps)."""
        pid = self.pid
        if pid is None:
            return False
        if hasattr(os, "waitid"):  # not on macOS
            try:
                return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
            except ChildProcessError:
                return False
        try:
            os.kill(pid, 0)  # a zombie passes: a rank that cannot reach it restarts it (_RankPopen)
        except OSError:
            return False
        return True

    @property
    def pid(self) -> int | None:
        return self._forkserver_pid  # type: ignore[attr-defined]  # ForkServer's own (private) state

    def stop(self) -> None:
        """Stop the server (ranks it forked keep running until their Cluster stops them)."""
        self._stop()  # type: ignore[attr-defined]  # ForkServer's (private; its tests use it)
        self.log.remove()


def preload(*modules: str) -> None:
    """Have servers started from now on import ``modules`` too (what the ranks' work imports)."""
    for name in modules:
        if name not in _preload:
            _preload.append(name)


def server_for(environ: dict[str, str], hosts_network: bool = False) -> RankServer:
    """The running server whose import-time variables are ``environ``'s (and that hosts the private network,
    if asked), started if there is none."""
    global _owner
    key = (import_time_part(environ), hosts_network)
    with _lock:
        if os.getpid() != _owner:  # a forked copy of this process: those servers are not our children
            _servers.clear()
            _owner = os.getpid()
        server = _servers.get(key)
        if server is None:
            server = _servers[key] = RankServer(environ, hosts_network)
    server.ensure_running()
    return server


def stop_all() -> None:
    """Stop every server this process started (they also leave by themselves when it exits)."""
    with _lock:
        servers = list(_servers.values()) if os.getpid() == _owner else []
        _servers.clear()
    for server in servers:
        server.stop()


def _interactive() -> bool:
    """A Jupyter kernel, an IPython shell or Python's own prompt: someone will run a cell next."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)
    return shell() is not None or hasattr(sys, "ps1") or bool(sys.flags.interactive)


def why_not_prewarm() -> str | None:
    """Why :func:`prewarm` does nothing in this process, or None if it starts a server.

    Unset, the variable means "in an interactive kernel only": a script, ``--help`` or ``doctor``
    that imports the package starts no process until it runs something.
    """
    wanted = os.environ.get(PREWARM_VARIABLE, "auto").strip().lower()
    if wanted in ("0", "false", "no", "off", ""):
        return f"{PREWARM_VARIABLE}={os.environ[PREWARM_VARIABLE]!r}"
    if wanted not in ("auto", "1", "true", "yes", "on"):
        warnings.warn(
            f"{PREWARM_VARIABLE}={os.environ[PREWARM_VARIABLE]!r} is not a setting: use 0 (never), 1 (at import, in "
            "scripts too) or auto (the default: in an interactive kernel); no rank server starts at import",
            RuntimeWarning,
            stacklevel=2,
        )
        return f"{PREWARM_VARIABLE}={os.environ[PREWARM_VARIABLE]!r} is not a setting"
    if "RANK" in os.environ or "LOCAL_RANK" in os.environ:
        return "under torchrun (RANK or LOCAL_RANK is set): the launcher starts the ranks"
    if multiprocessing.parent_process() is not None or getattr(process.current_process(), "_inheriting", False):
        return "a multiprocessing child, not a main interpreter"
    if DEFAULT_START_METHOD != "forkserver":
        return f"no forkserver start method on {sys.platform}"
    if wanted == "auto" and not _interactive():
        return f"not an interactive kernel (a script starts ranks when it runs; {PREWARM_VARIABLE}=1: at import)"
    return None


def prewarm() -> RankServer | None:
    """Start the default rank server now, so that torch is loaded in it before the first run asks for ranks.

    Called when the package is imported; does nothing in scripts (unless ``COMMHOOKS_LAB_PREWARM=1``),
    in ranks, under torchrun, or with ``COMMHOOKS_LAB_PREWARM=0``. Never raises: without it the first
    run starts the server itself.
    """
    if why_not_prewarm() is not None:
        return None
    try:
        return default_server()
    except Exception:
        return None


def default_server() -> RankServer:
    """The server a plain ``Cluster()`` in this process uses (the notebook's environment), started if needed."""
    from .isolation import isolates

    return server_for({**os.environ, **child_environment()}, hosts_network=isolates("gloo", DEFAULT_START_METHOD))


class _RankPopen(popen_forkserver.Popen):
    """``popen_forkserver.Popen`` that asks a given server, does not re-import ``__main__``, and times out."""

    def __init__(self, process_obj, server: RankServer, timeout_s: float):
        self._server, self._timeout_s = server, timeout_s
        super().__init__(process_obj)

    def _launch(self, process_obj) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_path", None)
        prep_data.pop("init_main_from_name", None)
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            _reduction.dump(prep_data, buf)
            _reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        self.sentinel, w = self._connect()
        _parent_w = os.dup(w)  # the rank's sign that we are alive: it leaves when this closes
        self.finalizer = _util.Finalize(self, _util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        if not wait([self.sentinel], self._timeout_s):
            raise RankServerError(
                f"the rank server (pid {self._server.pid}) did not fork a rank within {self._timeout_s:g} s"
                f"{_server_said(self._server)}; start_method='spawn' starts ranks without it"
            )
        try:
            self.pid = forkserver.read_signed(self.sentinel)
        except (EOFError, OSError) as exc:
            raise RankServerError(
                f"the rank server (pid {self._server.pid}) exited before it forked a rank"
                f"{_server_said(self._server)}; start_method='spawn' starts ranks without it"
            ) from exc

    def _connect(self) -> tuple[int, int]:
        """Ask the server for a child; a server that cannot be reached is restarted once."""
        fds = self._fds  # type: ignore[attr-defined]  # popen_forkserver.Popen's own list
        try:
            return self._server.connect_to_new_process(fds)
        except OSError:
            with self._server._start_lock:
                self._server.restart()
        try:
            return self._server.connect_to_new_process(fds)
        except OSError as exc:
            raise RankServerError(
                f"could not reach the rank server (pid {self._server.pid}): {exc}{_server_said(self._server)}; "
                "start_method='spawn' starts ranks without it"
            ) from exc


def _server_said(server: RankServer) -> str:
    tail = server.log.tail(5).strip()
    return f' (its last words on stderr: "{tail}")' if tail else ""


class RankProcess(process.BaseProcess):
    """A ``multiprocessing.Process`` forked by the rank server that :func:`start` names."""

    _start_method = "forkserver"

    @staticmethod
    def _Popen(process_obj):
        return _RankPopen(process_obj, _launching.server, _launching.timeout_s)


def start(proc: RankProcess, server: RankServer, timeout_s: float = FORK_TIMEOUT_S) -> None:
    """``proc.start()``, forked by ``server``."""
    _launching.server, _launching.timeout_s = server, timeout_s
    try:
        proc.start()
    finally:
        _launching.server = _launching.timeout_s = None

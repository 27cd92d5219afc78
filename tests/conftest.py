import atexit
import os
import shutil
import signal
import time

import psutil
import pytest

from commhooks_lab import Cluster
from commhooks_lab.launcher import session

# multiprocessing's own singletons (the lab's rank servers are forkservers): one per parent, they
# leave when the parent does.
SHARED_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _helper_command(p: psutil.Process | None) -> bool:
    return p is not None and any(h in " ".join(p.cmdline()) for h in SHARED_HELPERS)


def is_helper(p: psutil.Process) -> bool:
    """A helper process itself; not a rank a forkserver forked, which shows its server's command line."""
    return _helper_command(p) and not _helper_command(p.parent())


def live_children(of: psutil.Process | None = None) -> set[int]:
    """Live descendants of ``of`` (default: this process), less multiprocessing's per-parent helper processes
    (their forked ranks count)."""
    pids = set()
    for p in (of or psutil.Process()).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not is_helper(p):
                pids.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def wait_gone(pids, timeout_s=5.0) -> set[int]:
    """The pids still alive after waiting up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        if alive:
            time.sleep(0.05)
    return alive


def session_members(sid: int) -> set[int]:
    """Live processes of the session ``sid`` (a command started with ``start_new_session=True``):
    its children stay in the session even after it exits and they are reparented."""
    pids = set()
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                pids.add(p.pid)
        except (OSError, psutil.Error):
            pass
    return pids


#: The test files that take longest (40 s to over 4 minutes each under ``-n 2``, ``--durations``), about longest first.
#: Under ``pytest -n 2`` (the README's test command) they start first, so that the run does not end with one worker
#: busy on one of them while the other has nothing left to do. Each worker starts with two files: the first, the
#: third... on one, the second, the fourth... on the other. test_launch and test_hardening mostly wait for timeouts
#: to fire (a sampler of /proc/stat found both cores idle for 15-45 s of a run where the two ran side by side):
#: they go second and fourth, on the worker beside test_other_machines, whose two notebook runs keep both cores busy.
STARTS_FIRST = (
    "tests/test_other_machines.py",
    "tests/test_launch.py",
    "tests/test_compile_compat.py",
    "tests/test_hardening.py",
    "tests/test_emulated_cpu.py",
    "notebooks/08_when_compression_pays_off.ipynb",
    "tests/test_mutations.py",
    "tests/test_testing.py",
    "notebooks/10_hooks_in_the_real_world.ipynb",
    "tests/test_torchrun_multinode.py",
)


def pytest_configure(config):
    """Every IPython kernel the tests start checks its figures on ``plt.show()`` (``testing.figure_layout``): a
    notebook figure whose text collides, is cut off or hides data, or whose axis has one tick or no label, fails
    its cell under nbval, naming what does not read."""
    import tempfile

    from commhooks_lab.testing.figure_layout import write_ipython_startup

    folder = tempfile.mkdtemp(prefix="commhooks-ipython-")
    write_ipython_startup(folder)
    os.environ["IPYTHONDIR"] = folder
    # at exit, not at pytest's clean-up: registered before any in-process IPython shell, so it runs after
    # the shell writes its history there
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """The files of STARTS_FIRST first, in its order; every other item keeps its place (the sort is stable)."""
    rank = {path: i for i, path in enumerate(STARTS_FIRST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))


@pytest.fixture(scope="module")
def cluster():
    """Two warm ranks shared by one test module's tests (a module that needs another size defines its own)."""
    with Cluster(world_size=2) as c:
        yield c


@pytest.fixture(autouse=True)
def fresh_session():
    """Every test starts without the warm session's ranks and leaves none: tests never share warm ranks."""
    yield
    session.close()


@pytest.fixture
def keyboard_interrupts():
    """SIGINT raises KeyboardInterrupt in this process, as in a kernel: pytest-xdist's workers ignore SIGINT
    (their controller takes Ctrl-C), so a test that interrupts itself sets Python's own handler back."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def no_leftover_processes():
    """Fail the test if it leaves any child process behind once the warm session is closed.

    The session keeps its ranks on purpose (until ``session.close()`` or exit); what must never
    happen is a rank that outlives ``session.close()``, or ranks the session does not know.
    """
    before = live_children()
    yield
    session.close()
    left = wait_gone(live_children() - before, timeout_s=3.0)
    assert not left, f"child processes left behind: {sorted(left)}"


def pytest_sessionfinish(session, exitstatus):
    """No pytest run leaves ranks behind, whatever its tests did."""
    from commhooks_lab.launcher import session as lab_session

    lab_session.close()


def load_script(name: str):
    """``scripts/<name>.py`` as a module, for tests of a script's functions."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

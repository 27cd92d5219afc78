import atexit
import os
import shutil
import signal
import sys
import time
from pathlib import Path

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


#: The kinds of test, one folder each under ``tests/`` (the notebooks under ``notebooks/`` are of kind ``notebooks``).
#: Each item gets its folder's marker (registered in pyproject.toml): ``pytest tests/unit`` (or ``-m unit``) is the
#: fast loop.
#: In this order the files start under ``pytest -n 2``: see :func:`pytest_collection_modifyitems`.
KINDS = ("other_machines", "notebooks", "browser", "multiprocess", "unit")
FOLDERS = {kind: f"tests/{kind}" for kind in KINDS}


def kind_of(relative: Path) -> str | None:
    """The kind of a test file, from its path relative to the repository; None outside every kind's folder."""
    parts = relative.parts
    if len(parts) > 1 and parts[0] == "notebooks":
        return "notebooks"
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in KINDS:
        return parts[1]
    return None


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
    """Mark each item with its kind, and start files by kind, the slowest kind first (the sort is stable).

    The order is a rule, not a list of files: other_machines (a minute or more per file: emulated CPUs, other
    accounts, the course run again), notebooks (a kernel each, 5-50 s), browser (Chromium, 10-45 s a file, skipped
    where it is missing), multiprocess (ranks, seconds per test), unit (milliseconds: they fill the last seconds).
    Within a kind, files keep pytest's order (by path). ``--dist loadfile --no-loadscope-reorder``
    (pyproject.toml) makes pytest-xdist give each worker two files to start with (the first and third to one, the
    second and fourth to the other), then the next file to whichever is free: longest first, so the run does not
    end with one worker on a long file while the other has nothing left to do.

    A file marked ``waits`` mostly waits for a timeout to fire, with both cores idle; one marked ``heavy`` is CPU work
    that should have those cores (marked by measuring: with test_emulated_cpu, two ranks under qemu, in
    test_compile_compat's place, the whole suite took 527-561 s against 481 s, since test_other_machines then ran
    beside files that compete for the CPU). They start first, paired (heavy, waits, heavy, waits): the heavy
    files on one worker, the waiting ones on the other, so that the idle seconds go to the heavy files and two
    heavy files do not start side by side.
    """
    root = config.rootpath
    rank = {kind: i for i, kind in enumerate(KINDS)}
    kinds = {}
    for item in items:
        kind = kind_of(item.path.relative_to(root)) if item.path.is_relative_to(root) else None
        kinds[item.nodeid] = kind
        if kind is not None:
            item.add_marker(kind)
    items.sort(key=lambda item: rank.get(kinds[item.nodeid], len(rank)))
    files = list(dict.fromkeys(item.path for item in items))
    marked = {
        name: [f for f in files if any(i.path == f and i.get_closest_marker(name) for i in items)]
        for name in ("heavy", "waits")
    }
    heavy, waiting = marked["heavy"], marked["waits"]
    order = [f for pair in zip(heavy, waiting) for f in pair]  # heavy, waits, heavy, waits: one of each per worker
    order += [f for f in heavy + waiting + files if f not in order]
    position = {f: i for i, f in enumerate(order)}
    items.sort(key=lambda item: position[item.path])


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
    """``scripts/<name>.py`` as a module, for tests of a script's functions. The scripts folder is on ``sys.path``
    while it loads, as it is when the script runs: scripts import their helpers (``_smoke``) from beside them."""
    import importlib.util

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(scripts))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(scripts))
    return module

import os
import time

import psutil
import pytest

# multiprocessing's own singletons: one per parent, they leave when the parent does.
SHARED_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def live_children() -> set[int]:
    """Our live descendants, less multiprocessing's per-parent helper processes."""
    pids = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not any(h in " ".join(p.cmdline()) for h in SHARED_HELPERS):
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


@pytest.fixture
def no_leftover_processes():
    """Fail the test if it leaves any child process behind."""
    before = live_children()
    yield
    left = wait_gone(live_children() - before, timeout_s=3.0)
    assert not left, f"child processes left behind: {sorted(left)}"

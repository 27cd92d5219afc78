"""Cluster: warm ranks between runs, clean restart after errors, nothing left behind."""

import contextlib
import gc
import ipaddress
import os
import subprocess
import sys
import textwrap
import time

import _workers
import pytest
from conftest import wait_gone

from commhooks_lab import Cluster, WorkerError

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def test_runs_reuse_the_same_ranks_and_the_same_group():
    with Cluster(world_size=2) as cluster:
        pids = cluster.pids
        first = cluster.run(_workers.rank_and_sum)
        second = cluster.run(_workers.rank_and_sum, 1.0)
        assert [r["pid"] for r in first] == [r["pid"] for r in second] == pids
        assert [r["sum"] for r in second] == [5.0, 5.0]
        assert cluster.starts == 1
    assert not cluster.alive
    assert wait_gone(pids) == set()


def test_a_worker_error_restarts_the_cluster_cleanly():
    cluster = Cluster(world_size=2, timeout_s=30)
    try:
        old = cluster.pids
        with pytest.raises(WorkerError, match="boom from rank 0"):
            cluster.run(_workers.raise_on_rank, 0)
        assert wait_gone(old) == set()  # the broken group is gone at once
        rows = cluster.run(_workers.rank_and_sum)
        assert [r["sum"] for r in rows] == [3.0, 3.0]
        assert not set(r["pid"] for r in rows) & set(old)
        assert cluster.starts == 2
    finally:
        cluster.close()
    cluster.close()  # twice is fine


def test_garbage_collection_stops_the_ranks():
    cluster = Cluster(world_size=2)
    pids = cluster.pids
    del cluster
    gc.collect()
    assert wait_gone(pids) == set()


def test_a_crash_at_teardown_after_results_is_reported_not_raised():
    with Cluster(world_size=2) as cluster:
        assert cluster.run(_workers.abort_at_teardown) == [0, 1]
    assert len(cluster.teardown_notes) == 2
    assert "SIGABRT" in cluster.teardown_notes[0]
    assert "after it had delivered all its results" in cluster.teardown_notes[0]


def _python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )


def test_interpreter_exit_stops_the_ranks():
    out = _python("""
        import commhooks_lab
        cluster = commhooks_lab.Cluster(world_size=2)
        print(*cluster.pids)
    """)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr
    assert wait_gone(pids) == set()


def test_ranks_leave_when_their_parent_is_killed():
    out = _python("""
        import os, commhooks_lab
        cluster = commhooks_lab.Cluster(world_size=2)
        print(*cluster.pids, flush=True)
        os._exit(9)  # no finalizers, no atexit: like a kernel killed with SIGKILL
    """)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr
    assert wait_gone(pids, timeout_s=5) == set()


def test_a_warm_run_skips_the_start_up():
    with Cluster(world_size=2) as cluster:
        cluster.run(_workers.pid)
        start = time.perf_counter()
        cluster.run(_workers.rank_and_sum)
        warm = time.perf_counter() - start
    # Not a benchmark (bench/launch.py is): only that no process was started for this run.
    assert cluster.starts == 1 and warm < 1.0


def _listening(pid: int) -> list[str]:
    """The addresses ``pid`` listens on, read in its own network namespace (psutil reads the caller's, where a
    rank in the lab's private network has no sockets)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, size in (("tcp", 4), ("tcp6", 16)):
        with open(f"/proc/{pid}/net/{table}") as f:
            for row in f.read().splitlines()[1:]:
                local, state, inode = row.split()[1], row.split()[3], row.split()[9]
                if state == "0A" and inode in inodes:  # LISTEN
                    raw = bytes.fromhex(local.split(":")[0])
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, size, 4))  # each 32-bit word's bytes
                    found.append(str(ipaddress.ip_address(words)))
    return found


def test_nothing_listens_beyond_loopback_while_a_cluster_is_up():
    with Cluster(world_size=2) as cluster:
        cluster.run(_workers.rank_and_sum)  # the group has talked: gloo's sockets are all open
        kernel = _listening(os.getpid())
        ranks = [addr for pid in cluster.pids for addr in _listening(pid)]
        rendezvous = cluster._store[0]
        assert os.stat(rendezvous.folder).st_mode & 0o777 == 0o700  # the ranks meet in a file only we can reach
        assert os.path.exists(rendezvous.path)
    assert not os.path.exists(rendezvous.folder)  # gone with the Cluster
    assert not kernel, f"the kernel listens on {kernel}: the rendezvous needs no socket"
    assert ranks  # gloo listens in every rank
    off_loopback = [addr for addr in kernel + ranks if not ipaddress.ip_address(addr).is_loopback]
    assert not off_loopback, f"listening beyond 127.0.0.1: {off_loopback}"

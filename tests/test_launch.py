"""launch(): real rank processes, results as data, every failure named, no process left."""

import os
import signal
import threading
import time

import _workers
import psutil
import pytest

from commhooks_lab import WorkerError, WorkerTimeoutError, launch

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def test_ranks_return_values_in_rank_order_and_report_events():
    events = []
    rows = launch(_workers.rank_and_sum, 10.0, world_size=3, on_event=lambda r, e: events.append((r, e)))
    assert [row["rank"] for row in rows] == [0, 1, 2]
    assert all(row["sum"] == 1 + 2 + 3 + 30 for row in rows)
    assert [row["env_rank"] for row in rows] == ["0", "1", "2"]  # torchrun's variables are set
    assert {row["omp"] for row in rows} == {"1"}  # one thread per rank: reproducible reductions
    assert len({row["pid"] for row in rows} | {os.getpid()}) == 4  # three separate processes
    assert sorted(r for r, _ in events) == [0, 1, 2]
    assert all(e == {"stage": "reduced", "value": 36.0} for _, e in events)


def test_single_rank_runs():
    (row,) = launch(_workers.rank_and_sum, world_size=1)
    assert row["sum"] == 1.0


def test_a_rank_that_raises_is_named_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        launch(_workers.raise_on_rank, 1, world_size=2, timeout_s=60)
    assert time.monotonic() - start < 10
    err = info.value
    assert err.rank == 1 and err.how == "raised"
    assert "rank 1 raised ValueError: boom from rank 1" in str(err)
    assert "raise_on_rank" in err.worker_traceback  # the worker's own frame, not the launcher's


@pytest.mark.parametrize("code", [3, 0])
def test_a_rank_that_exits_mid_work_is_named(code):
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        launch(_workers.exit_on_rank, 0, code, world_size=2, timeout_s=60)
    assert time.monotonic() - start < 10
    assert info.value.rank == 0 and info.value.how == "died"
    assert f"exited with code {code} while working" in str(info.value)


def test_a_rank_killed_by_a_signal_is_named():
    with pytest.raises(WorkerError) as info:
        launch(_workers.kill_self_on_rank, 1, world_size=2, timeout_s=60)
    assert info.value.rank == 1
    assert "killed by signal SIGKILL" in str(info.value)


def test_a_rank_that_skips_a_collective_times_out_and_is_named():
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError) as info:
        launch(_workers.skip_collective_on_rank, 1, world_size=2, timeout_s=3)
    elapsed = time.monotonic() - start
    assert 3 <= elapsed < 3 + 10
    assert info.value.rank == 1
    assert "no answer" in str(info.value)


def test_a_hang_outside_collectives_hits_the_wall_clock_watchdog():
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match=r"within timeout_s=2 s"):
        launch(_workers.sleep_forever, world_size=2, timeout_s=2)
    assert 2 <= time.monotonic() - start < 2 + 8  # watchdog margin and teardown included


def test_an_unpicklable_return_value_is_an_error_not_a_hang():
    with pytest.raises(WorkerError, match="cannot be pickled"):
        launch(_workers.return_unpicklable, world_size=2, timeout_s=30)


def test_keyboard_interrupt_terminates_the_ranks():
    timer = threading.Timer(4.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(_workers.sleep_forever, world_size=2, timeout_s=60)
    finally:
        timer.cancel()


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"world_size": 0}, ValueError, "at least 1"),
        ({"world_size": -2}, ValueError, "at least 1"),
        ({"world_size": 2.5}, TypeError, "positive int"),
        ({"world_size": True}, TypeError, "positive int"),
        ({"world_size": "2"}, TypeError, "positive int"),
        ({"world_size": 10_000}, ValueError, "torchrun"),
        ({"timeout_s": 0}, ValueError, "timeout_s"),
        ({"timeout_s": -1.0}, ValueError, "timeout_s"),
        ({"backend": "mpi"}, ValueError, "unknown backend"),
        ({"backend": "nccl"}, ValueError, "one CUDA device per rank"),
        ({"start_method": "thread"}, ValueError, "unknown start_method"),
    ],
)
def test_bad_options_are_refused_before_any_process_starts(kwargs, error, text):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(error, match=text):
        launch(_workers.pid, **kwargs)
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


def test_unpicklable_arguments_are_refused_before_any_process_starts():
    with pytest.raises(TypeError, match="cannot send"):
        launch(_workers.rank_and_sum, threading.Lock())
    with pytest.raises(TypeError, match="callable"):
        launch("not a function")


def test_twenty_launches_leave_no_process_thread_or_socket_behind():
    me = psutil.Process()
    launch(_workers.pid, world_size=2)  # warm imports once, so their threads don't count
    threads, sockets, fds = threading.active_count(), len(me.net_connections("inet")), me.num_fds()
    seen = set()
    for _ in range(20):
        seen.update(launch(_workers.pid, world_size=2))
    assert len(seen) == 40  # fresh processes every time
    assert threading.active_count() == threads
    assert len(me.net_connections("inet")) == sockets
    assert me.num_fds() == fds


def test_package_exports_the_launcher_api():
    import commhooks_lab.experiment  # noqa: F401  (importing submodules must not shadow the functions)
    import commhooks_lab.launcher.allreduce_check  # noqa: F401

    assert commhooks_lab.launch is launch and callable(commhooks_lab.selfcheck)
    with pytest.raises(AttributeError):
        getattr(commhooks_lab, "no_such_thing")  # noqa: B009

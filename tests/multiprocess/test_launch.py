"""launch(): real rank processes, results as data, every failure named, no process left."""

import os
import signal
import threading
import time

import _launcher_workers
import _workers
import psutil
import pytest

from commhooks_lab import Cluster, WorkerError, WorkerTimeoutError, launch

pytestmark = [pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.waits]


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
    with Cluster(world_size=2, timeout_s=2) as cluster:  # started: only the watchdog is timed
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError, match=r"within timeout_s=2 s"):
            cluster.run(_workers.sleep_forever)
        elapsed = time.monotonic() - start
    assert 2 <= elapsed < 2 + 12  # the watchdog's margin and the teardown included


def test_an_unpicklable_return_value_is_an_error_not_a_hang():
    with pytest.raises(WorkerError, match="cannot be pickled"):
        launch(_workers.return_unpicklable, world_size=2, timeout_s=30)


def test_keyboard_interrupt_terminates_the_ranks(keyboard_interrupts):
    timer = threading.Timer(4.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(_workers.sleep_forever, world_size=2, timeout_s=60)
    finally:
        timer.cancel()


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


# -- deaths explained: what a rank wrote to stderr comes back with the error ----------------------


@pytest.mark.parametrize("how, text", [("exit", "exited with code 7"), ("signal", "killed by signal SIGKILL (-9)")])
def test_a_rank_that_dies_without_an_exception_brings_its_last_stderr_lines(how, text):
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        launch(_launcher_workers.write_to_stderr_then_die, 1, 30, how, world_size=2, timeout_s=60)
    assert time.monotonic() - start < 10
    err = info.value
    assert err.rank == 1 and err.how == "died" and f"{text} while working" in str(err)
    lines = err.stderr_tail.splitlines()
    assert lines == [f"stderr line {i} from rank 1" for i in range(10, 30)]  # the last 20, in order
    assert "--- last lines rank 1 wrote to stderr ---\nstderr line 10 from rank 1" in str(err)


# -- reports from any thread -----------------------------------------------------------------------


def test_reports_from_a_gloo_callback_thread_and_the_main_thread_never_interleave():
    events: dict[int, list] = {0: [], 1: []}
    n, size = 500, 20_000
    main_threads = launch(
        _launcher_workers.report_from_a_callback_and_the_main_thread,
        n,
        size,
        world_size=2,
        timeout_s=60,
        on_event=lambda rank, event: events[rank].append(event),
    )
    blob = bytes(range(256)) * (size // 256)
    for got in events.values():
        assert len(got) == 2 * n  # 1,000 per rank: none lost
        assert all(e["blob"] == blob for e in got)  # none corrupted
        for source in ("callback", "main"):
            assert [e["i"] for e in got if e["source"] == source] == list(range(n))  # each thread's order kept
    callback_threads = {e["thread"] for e in events[0] if e["source"] == "callback"}
    assert len(callback_threads) == 1 and main_threads[0] not in callback_threads  # rank 0: really two threads


# -- a rank that never joins a collective: progress while waiting, then the rank and the step ------


@pytest.fixture
def stall_every_second(monkeypatch):
    from commhooks_lab.launcher import cluster

    monkeypatch.setattr(cluster, "STALL_REPORT_S", 1.0)


def test_a_rank_that_stops_before_a_step_is_named_with_the_step(stall_every_second, capsys):
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError) as info:
        launch(_launcher_workers.stop_beating_on_rank, 1, 2, 5, world_size=2, timeout_s=4)
    assert time.monotonic() - start < 4 + 10
    err = info.value
    assert (err.rank, err.step, err.how) == (1, 2, "timeout")
    assert str(err).startswith("rank 1 never reached step 2: it last reported step 1, while rank 0 waited for it")
    assert "also: rank 0 raised" in str(err)  # gloo's own timeout message, kept as a detail
    progress = capsys.readouterr().err
    assert "rank 1 has not reached step 2 for 1 s (rank 0 did, and waits)" in progress
    assert "rank 1 has not reached step 2 for 2 s" in progress  # and again while it waits


def test_a_rank_that_returns_early_is_named(stall_every_second, capsys):
    with pytest.raises(WorkerTimeoutError) as info:
        launch(_launcher_workers.return_early_on_rank, 0, 4, world_size=3, timeout_s=3)
    err = info.value
    assert (err.rank, err.step) == (0, 3)
    assert "never reached step 3: it returned after step 2, while ranks [1, 2] waited for it" in str(err)
    assert "rank 0 has not reached step 3" in capsys.readouterr().err


def test_a_run_in_which_a_rank_never_joins_the_hooks_collective_names_it(stall_every_second, capsys):
    from commhooks_lab import run

    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError) as info:
        run(hook=_launcher_workers.hang_on_rank_1_at_step_2, steps=5, timeout_s=4)
    assert time.monotonic() - start < 4 + 15
    err = info.value
    assert (err.rank, err.step) == (1, 2)
    assert "stopped answering in step 2 and never joined the collective that rank 0 waited in" in str(err)
    assert "no rank has gone past step 2 for 1 s" in capsys.readouterr().err


def test_a_busy_rank_that_says_it_is_alive_is_not_timed_out_and_one_that_says_nothing_is(capfd, monkeypatch):
    """ctx.alive() (what a compiling rank sends) restarts the silence timeout and claims no step, so the notebook
    prints no stall report; the same wait without it ends in a WorkerTimeoutError."""
    from commhooks_lab.launcher import cluster

    # The parent's watchdog margin is there for gloo's own timeout to report first; no collective runs here, so
    # a short one tests the same deadline in half the time.
    monkeypatch.setattr(cluster, "WATCHDOG_MARGIN_S", 1.0)
    seconds, timeout_s = 2 + cluster.WATCHDOG_MARGIN_S + 2.5, 2
    assert launch(_launcher_workers.busy_then_answer, seconds, 0.5, True, world_size=2, timeout_s=timeout_s) == [
        "done",
        "done",
    ]
    assert "has not reached step" not in capfd.readouterr().err
    with pytest.raises(WorkerTimeoutError):
        launch(_launcher_workers.busy_then_answer, seconds, 0.5, False, world_size=2, timeout_s=timeout_s)


def test_heartbeats_extend_the_timeout_of_a_long_run(monkeypatch):
    from commhooks_lab.launcher import cluster

    monkeypatch.setattr(cluster, "WATCHDOG_MARGIN_S", 1.0)  # as in the test above: a shorter deadline to outlast
    steps, seconds, timeout_s = 7, 0.75, 2
    assert steps * seconds > timeout_s + cluster.WATCHDOG_MARGIN_S + seconds  # longer than any deadline without beats
    rows = launch(_launcher_workers.beat_slowly, steps, seconds, world_size=2, timeout_s=timeout_s)
    assert rows == [steps, steps]

"""Every failure named by its real cause, every wait bounded, every bad input refused before a process starts.

Each test here is a fault that used to read as something else (or hang, or fail late inside the ranks); it now
gets a message that names the cause and the rank, within the run's ``timeout_s``, and leaves nothing running.
"""

import json
import os
import signal
import time
from pathlib import Path

import _launcher_workers
import pytest

import commhooks_lab as lab
from commhooks_lab import Cluster, WorkerError, WorkerTimeoutError
from commhooks_lab.launcher import session

pytestmark = [pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.waits]


# -- waits bounded by timeout_s, sends included ---------------------------------------------------------------


def test_a_stopped_rank_and_a_large_task_end_within_the_timeout_naming_the_rank(monkeypatch):
    from commhooks_lab.launcher import cluster as cluster_module

    # The watchdog's margin is there for gloo's own timeout to report first; a stopped rank runs no collective, so
    # a short margin tests the same deadline sooner (as in test_launch's busy-rank test).
    monkeypatch.setattr(cluster_module, "WATCHDOG_MARGIN_S", 1.0)
    with Cluster(world_size=2, timeout_s=3) as cluster:
        stopped = cluster.pids[1]
        os.kill(stopped, signal.SIGSTOP)
        start = time.monotonic()
        try:
            with pytest.raises(WorkerTimeoutError) as info:
                cluster.run(_launcher_workers.length_of, b"x" * (64 << 20))  # far more than a pipe holds
        finally:
            if cluster.alive:
                os.kill(stopped, signal.SIGCONT)
        elapsed = time.monotonic() - start
    assert elapsed < 3 + cluster_module.WATCHDOG_MARGIN_S + 10, f"the parent waited {elapsed:.0f} s"
    assert info.value.rank == 1 and "never took its task" in str(info.value) and "SIGSTOP" in str(info.value)


# -- the real cause ------------------------------------------------------------------------------------------


def test_a_hook_that_skips_its_collective_on_rank_1_is_blamed_on_rank_1():
    with pytest.raises(WorkerTimeoutError) as info:
        lab.run(hook=_launcher_workers.skip_on_rank_1_at_step_2, steps=5, timeout_s=4, fresh=True)
    assert info.value.rank == 1 and "fell out of step with the others' collectives" in str(info.value)
    assert "rank 0 kept to the pattern" in str(info.value)


def test_a_future_that_never_completes_is_told_apart_from_a_missing_rank():
    with pytest.raises(WorkerTimeoutError) as info:
        lab.run(hook=_launcher_workers.never_complete, steps=3, timeout_s=3, fresh=True)
    assert "as did every rank, with no collective timing out" in str(info.value)
    assert "a hook's Future that is never completed" in str(info.value)


def test_a_rendezvous_folder_removed_under_the_ranks_is_named():
    import shutil

    with Cluster(world_size=2, timeout_s=10) as cluster:
        assert cluster.run(_launcher_workers.sum_in_a_new_group) == [2.0, 2.0]
        shutil.rmtree(cluster._store[0].folder)  # a temp cleaner, or a learner tidying /tmp
        with pytest.raises(WorkerError, match="rendezvous folder .* was removed while they ran"):
            cluster.run(_launcher_workers.sum_in_a_new_group)
        assert cluster.run(_launcher_workers.sum_in_a_new_group) == [2.0, 2.0]  # new ranks, a new folder


def test_the_rank_servers_death_is_named():
    with Cluster(world_size=2, timeout_s=10, start_method="forkserver") as cluster:
        server = cluster._server.pid
        with pytest.raises(WorkerError) as info:
            cluster.run(_launcher_workers.kill_the_rank_server)
    assert f"the rank server (pid {server}) that forked it died first" in str(info.value)


def test_a_rank_killed_by_sigkill_outside_the_lab_is_not_called_an_oom_kill():
    with pytest.raises(WorkerError) as info:
        lab.launch(_launcher_workers.write_to_stderr_then_die, 1, 1, "signal", world_size=2)
    assert "SIGKILL" in str(info.value) and "not the out-of-memory killer" in str(info.value)


def _memory_cgroup() -> Path | None:
    """A memory cgroup of our own to move a rank into (cgroup v1 or v2), or None where we may not make one."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            limit = "memory.limit_in_bytes"
        elif controllers == "":
            base = Path("/sys/fs/cgroup/unified") / path.lstrip("/")
            base = base if base.exists() else Path("/sys/fs/cgroup") / path.lstrip("/")
            limit = "memory.max"
        else:
            continue
        group = base / f"commhooks-oom-{os.getpid()}"
        try:
            group.mkdir()
        except OSError:
            continue
        if (group / limit).exists():
            return group
        group.rmdir()
    return None


def test_an_out_of_memory_kill_is_named_as_one():
    if os.geteuid() != 0:
        pytest.skip("needs root to make a memory cgroup")
    group = _memory_cgroup()
    if group is None:
        pytest.skip("no writable memory cgroup here")
    limit = "memory.limit_in_bytes" if (group / "memory.limit_in_bytes").exists() else "memory.max"
    try:
        with Cluster(world_size=2, timeout_s=20) as cluster:
            rank1 = cluster.pids[1]
            rss = int(Path(f"/proc/{rank1}/status").read_text().split("VmRSS:")[1].split()[0]) * 1024
            (group / limit).write_text(str(rss + (96 << 20)))
            (group / "cgroup.procs").write_text(str(rank1))
            with pytest.raises(WorkerError) as info:
                cluster.run(_launcher_workers.allocate_on_rank_1, 512)
    finally:
        for _ in range(50):  # the rank must be gone before its cgroup can be removed
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert info.value.rank == 1 and "SIGKILL" in str(info.value)
    assert "out-of-memory killer" in str(info.value) and "most likely the one killed, for memory" in str(info.value)


# -- refused before any process starts ------------------------------------------------------------------------


def test_an_environment_that_is_not_strings_is_refused_before_ranks_start():
    with pytest.raises(TypeError, match=r"env must map str to str .*'X': 4"):
        Cluster(world_size=2, env={"X": 4})


def test_a_hook_that_cannot_travel_is_refused_before_the_sessions_ranks_start():
    import threading

    lock = threading.Lock()

    def hook_with_a_lock(state, bucket):
        with lock:
            return None

    session.close()
    with pytest.raises(TypeError, match="cannot send"):
        lab.run(hook=hook_with_a_lock, steps=2)
    assert session.active() == []


def test_loading_a_file_that_is_not_a_result_names_it(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(ValueError, match=r"weights\.bin is not UTF-8 text .*: it is not a saved commhooks_lab Result"):
        lab.load(binary)


def _saved(tmp_path) -> dict:
    import pandas as pd

    steps = pd.DataFrame({"step": [0, 1], "loss": [2.0, 1.5], "accuracy": [float("nan"), 0.5]})
    layers = pd.DataFrame({"step": [0, 1], "layer": ["w", "w"], "rel_error": [0.1, 0.2]})
    result = lab.Result({"hook": "fp16", "steps": 2}, steps, layers, ["a note"], {"task": "t"}, {"x": 1})
    path = result.save(tmp_path / "good.json")
    return json.loads(Path(path).read_text())


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda d: d.pop("config"), "field 'config' must be a dict, found missing"),
        (lambda d: d.update(final=[1, 2]), "field 'final' must be a dict, found a list"),
        (lambda d: d.update(notes="one note"), "field 'notes' must be a list, found a str"),
        (lambda d: d.update(notes=[1]), "field 'notes' must be a list of strings"),
        (lambda d: d.update(env=None), "field 'env' must be a dict, found a NoneType"),
        (lambda d: d.update(sample=[]), "field 'sample' must be a dict or null"),
        (lambda d: d["steps"].pop("columns"), r"steps\.columns must be a list of column names"),
        (lambda d: d["steps"]["dtypes"].pop("loss"), r"steps\.dtypes must give one dtype name for each"),
        (lambda d: d["layers"]["data"].append([1]), r"layers\.data must be a list of rows, each with 3 values"),
        (lambda d: d["steps"]["data"][0].__setitem__(0, None), "steps does not match its dtypes"),
        (lambda d: d["steps"]["dtypes"].update(loss="no-such-dtype"), r"steps\.dtypes .* not types the lab saves"),
        (lambda d: None, "nests its lists and objects deeper"),  # 100,000 nested lists: json's RecursionError
    ],
)
def test_a_saved_result_with_a_wrong_field_is_refused_naming_the_file_and_the_field(tmp_path, damage, says):
    document = _saved(tmp_path)
    assert isinstance(lab.load(tmp_path / "good.json"), lab.Result)
    damage(document)
    bad = tmp_path / "bad.json"
    text = json.dumps(document) if "nests" not in says else "[" * 10**5 + "]" * 10**5
    bad.write_text(text)
    with pytest.raises(ValueError, match=r"bad\.json"):
        lab.load(bad)
    with pytest.raises(ValueError, match=says):
        lab.load(bad)


def test_a_file_too_large_for_a_result_is_refused_before_it_is_read(tmp_path, monkeypatch):
    import os

    from commhooks_lab import result

    monkeypatch.setattr(result, "MAX_FILE_BYTES", 1000)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2000)
    monkeypatch.setattr(os, "read", lambda *a, **k: pytest.fail("read a file over the limit"))
    with pytest.raises(ValueError, match=r"big\.json is 2,000 bytes, more than any file the lab writes"):
        lab.load(big)


# -- training that goes non-finite ----------------------------------------------------------------------------


def test_a_hook_that_writes_nan_gets_a_note_naming_the_step_and_the_parameter():
    result = lab.run(hook=_launcher_workers.nan_hook, steps=3, measure=False)
    (note,) = [n for n in result.notes if "non-finite" in n]
    assert "parameter '0.weight' holds a NaN or an infinity after step 0's update" in note


def test_a_learning_rate_that_blows_up_gets_a_note():
    result = lab.run(hook="allreduce", steps=12, lr=1e6)
    (note,) = [n for n in result.notes if "non-finite" in n]
    assert "lr=1e+06" in note and ("the loss is nan" in note or "holds a NaN" in note)

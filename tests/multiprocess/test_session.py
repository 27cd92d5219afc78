"""The warm session: one set of ranks per kernel, and not one bit of a run leaks into the next."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import _bad_hooks
import pytest
from _same_run import assert_same_run
from conftest import wait_gone

import commhooks_lab as lab
from commhooks_lab import WorkerError
from commhooks_lab.launcher import session
from commhooks_lab.launcher.rank_server import DEFAULT_START_METHOD

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

PS = {"matrix_approximation_rank": 2, "start_powerSGD_iter": 2}
EF = {"error_feedback": True}
#: Every built-in hook, compressor family (with error feedback), wrapper and api.
CASES = {
    "no": {"hook": "no"},
    "allreduce": {"hook": "allreduce"},
    "fp16": {"hook": "fp16"},
    "bf16": {"hook": "bf16"},
    "power_sgd": {"hook": "power_sgd", "state_options": PS},
    "batched_power_sgd": {"hook": "batched_power_sgd", "state_options": PS},
    "noop": {"hook": "noop"},
    "ring16": {"hook": "ring16"},
    "wire16_sum32": {"hook": "wire16_sum32", "state_options": {"dtype": "float16"}},
    **{f"{name}+EF": {"hook": name, "state_options": EF} for name in ("topk", "randomk", "sign", "qsgd", "terngrad")},
    "int8+EF": {"hook": "int8", "state_options": EF},
    "fp16_wrapper(power_sgd)": {"hook": "power_sgd", "wrapper": "fp16", "state_options": PS},
    "bf16_wrapper(allreduce)": {"hook": "allreduce", "wrapper": "bf16"},
    "accelerate power_sgd": {"hook": "power_sgd", "state_options": PS, "api": "accelerate"},
    "accelerate bf16_wrapper(power_sgd)": {
        "hook": "power_sgd",
        "wrapper": "bf16",
        "state_options": PS,
        "api": "accelerate",
    },
    "accelerate no": {"hook": "no", "api": "accelerate"},
    "fsdp2 fp16": {"hook": "fp16", "api": "fsdp2"},
    "fsdp2 bf16": {"hook": "bf16", "api": "fsdp2"},
}
STEPS = 3


@pytest.fixture(scope="module")
def warm_runs():
    """Every case on one warm session, twice: in order, then in reverse order, so each case runs after
    two different hooks (and after itself never). Returns {case: (forward run, reverse run)}."""
    if pytest.importorskip("accelerate") is None:
        return None
    names = list(CASES)
    forward = {name: lab.run(steps=STEPS, **CASES[name]) for name in names}
    pids = session.active()[0].pids
    backward = {name: lab.run(steps=STEPS, **CASES[name]) for name in reversed(names)}
    assert session.active()[0].pids == pids, "every warm run used the same two ranks"
    session.close()
    return {name: (forward[name], backward[name]) for name in names}


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_on_warm_ranks_is_bit_identical_to_one_on_fresh_ranks(warm_runs, case):
    fresh = lab.run(steps=STEPS, fresh=True, **CASES[case])
    after_one, after_another = warm_runs[case]
    assert_same_run(after_one, fresh)
    assert_same_run(after_another, fresh)
    assert fresh.steps["loss"].notna().all() and len(fresh.final["param_digests"]) == 2


def test_runs_compares_and_the_dashboard_share_one_set_of_ranks():
    assert session.active() == []
    lab.run(hook="fp16", steps=2)
    (cluster,) = session.active()
    pids = cluster.pids
    lab.compare(["allreduce", "bf16"], steps=2)
    board = lab.HookLab(steps=2)
    try:
        board.run_button.click()
        assert not board.error.value, board.error.value
        assert board.cluster is cluster
    finally:
        board.close()
    assert session.active() == [cluster] and cluster.pids == pids and cluster.starts == 1
    assert lab.run(hook="fp16", steps=2).env["start_method"] == DEFAULT_START_METHOD


def test_fresh_runs_and_your_own_cluster_leave_the_session_alone():
    lab.run(hook="fp16", steps=2, fresh=True)
    lab.compare(["fp16", "bf16"], steps=2, fresh=True)
    assert session.active() == []
    with lab.Cluster(world_size=2) as mine:
        lab.run(hook="fp16", steps=2, cluster=mine)
        assert session.active() == []
        with pytest.raises(ValueError, match="either cluster= .* or fresh=True"):
            lab.run(hook="fp16", steps=2, cluster=mine, fresh=True)
    board = lab.HookLab(steps=2, fresh=True)
    try:
        board.run_button.click()
        assert board.cluster is not None and board.cluster not in session.active()
        pids = board.cluster.pids
    finally:
        board.close()
    assert wait_gone(pids) == set()  # the dashboard's own ranks stop with it


def test_a_worker_error_resets_the_session():
    first = lab.run(hook="fp16", steps=2)
    (cluster,) = session.active()
    old = cluster.pids
    with pytest.raises(WorkerError, match="not a torch.futures.Future"):
        lab.run(hook=_bad_hooks.returns_the_tensor, steps=2)
    assert session.active() == [] and wait_gone(old) == set()
    again = lab.run(hook="fp16", steps=2)
    (restarted,) = session.active()
    assert not set(restarted.pids) & set(old) and restarted.starts == 2
    assert again.final["param_digests"] == first.final["param_digests"]


def test_a_rank_that_died_between_runs_resets_the_session():
    first = lab.run(hook="fp16", steps=2)
    (cluster,) = session.active()
    old = cluster.pids
    os.kill(old[1], signal.SIGKILL)
    deadline = time.monotonic() + 5  # the rank server reports the death as soon as it has reaped the rank
    while session.active() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session.active() == []
    again = lab.run(hook="fp16", steps=2)
    assert cluster.alive and cluster.starts == 2 and not set(cluster.pids) & set(old)
    assert wait_gone(old) == set()
    assert again.final["param_digests"] == first.final["param_digests"]


def test_close_stops_every_rank_and_the_next_run_starts_new_ones():
    lab.run(hook="fp16", steps=2)
    lab.run(hook="fp16", steps=2, world_size=3)
    pids = [pid for cluster in session.active() for pid in cluster.pids]
    assert len(pids) == 5
    session.close()
    assert session.active() == [] and wait_gone(pids) == set()
    session.close()  # twice is fine
    lab.run(hook="fp16", steps=2)
    assert not set(session.active()[0].pids) & set(pids)


def test_another_timeout_replaces_the_session_cluster():
    """timeout_s is fixed in the ranks' process group when they join it."""
    lab.run(hook="fp16", steps=2)
    (before,) = session.active()
    lab.run(hook="fp16", steps=2, timeout_s=45)
    (after,) = session.active()
    assert after is not before and after.spec.timeout_s == 45 and not before.alive


def test_the_session_stops_at_interpreter_exit():
    code = """
        import commhooks_lab as lab
        lab.run(hook="fp16", steps=2)
        print(*lab.session.active()[0].pids)
    """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=False
    )
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr
    assert wait_gone(pids) == set()

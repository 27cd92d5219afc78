"""``%%ddp``: cells on the kernel's warm ranks, with namespaces that persist, errors named per rank, hangs and
interrupts that end cleanly, values moved both ways."""

import _thread
import threading
import time

import pytest
from _ddp_magic import ddp_started
from IPython.core.error import UsageError

import commhooks_lab as lab
from commhooks_lab.magics import DDPCellError, format_outputs

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


@pytest.fixture(scope="module")
def shell():
    with ddp_started("-n 2") as ip:
        yield ip


def cell(shell, code: str, line: str = ""):
    return shell.run_cell_magic("ddp", line, code)


def test_a_namespace_persists_between_cells_and_the_process_group_is_ready(shell, capsys):
    cell(shell, "x = torch.tensor([float(rank + 1)])\ndist.all_reduce(x)")
    capsys.readouterr()
    cell(shell, "print(rank, world_size, x.item())")
    out = capsys.readouterr().out
    assert "[rank 0]\n0 2 3.0" in out and "[rank 1]\n1 2 3.0" in out


def test_ranks_that_print_the_same_are_shown_once_and_the_last_value_is_shown(shell, capsys):
    cell(shell, "print('same on every rank')\nworld_size * 10")
    assert capsys.readouterr().out == "[ranks 0, 1]\nsame on every rank\n20\n"


def test_a_cell_can_run_on_some_ranks(shell, capsys):
    cell(shell, "only = 'here'\nprint(only)", line="--rank 1")
    assert capsys.readouterr().out == "[rank 1]\nhere\n"
    with pytest.raises(DDPCellError, match="rank 0"):
        cell(shell, "only")  # rank 0 never ran the cell above
    assert "NameError: name 'only' is not defined" in capsys.readouterr().out
    with pytest.raises(UsageError, match="ranks are 0..1"):
        cell(shell, "pass", line="--rank 2")


def test_an_error_on_one_rank_is_named_and_the_namespaces_survive(shell, capsys):
    cell(shell, "kept = rank")
    with pytest.raises(DDPCellError, match="the cell raised on rank 1"):
        cell(shell, "if rank == 1:\n    1 / 0\nprint('fine')")
    out = capsys.readouterr().out
    assert "[rank 0]\nfine" in out and "[rank 1] Traceback" in out and "ZeroDivisionError" in out
    assert "%%ddp cell, rank 1" in out  # the traceback names the cell and the rank
    cell(shell, "print(kept)")
    assert "[rank 0]\n0" in capsys.readouterr().out


def _rank_pids() -> list[list[int]]:
    from commhooks_lab.launcher import session

    return [cluster.pids for cluster in session.active()]


BAD_CELLS = {
    "x = (1,": "SyntaxError",
    "import sys; sys.exit(3)": "SystemExit: 3",
    "import sys; print('before'); sys.stdout.close()": None,  # its text still comes back
    "import os; os.fork()": "os.fork() in a %%ddp cell",
    "import multiprocessing as mp; mp.get_context('fork').Process(target=print).start()": "daemonic processes",
}


@pytest.mark.parametrize("code", list(BAD_CELLS))
def test_no_cell_a_learner_writes_stops_the_ranks_or_loses_the_namespaces(shell, capsys, code):
    cell(shell, "kept = rank + 10")
    pids = _rank_pids()
    if BAD_CELLS[code] is None:
        cell(shell, code)
        assert "[ranks 0, 1]\nbefore" in capsys.readouterr().out
    else:
        with pytest.raises(DDPCellError, match="the cell raised on ranks 0, 1"):
            cell(shell, code)
        assert BAD_CELLS[code] in capsys.readouterr().out
    cell(shell, "print(kept)")
    assert "[rank 0]\n10\n[rank 1]\n11" in capsys.readouterr().out
    assert _rank_pids() == pids


def test_bad_magic_arguments_are_usage_errors_and_the_ranks_stay(shell, capsys):
    cell(shell, "kept = rank")
    pids = _rank_pids()
    for line, says in [("start --bogus", "unrecognized arguments: --bogus"), ("pull kept --bogus", "--bogus"),
                       ("start -n", "expected one argument")]:  # fmt: skip
        with pytest.raises(UsageError, match=says):
            shell.run_line_magic("ddp", line)
    for line, says in [("--bogus", "unrecognized arguments"), ("--rank abc", "give rank numbers"),
                       ("--timeout soon", "invalid float value")]:  # fmt: skip
        with pytest.raises(UsageError, match=says):
            cell(shell, "pass", line=line)
    with pytest.raises(ValueError, match="world_size must be at least 1, got -3"):
        shell.run_line_magic("ddp", "start -n -3")
    shell.run_line_magic("ddp", "status")
    assert capsys.readouterr().out.endswith("2 ranks running\n")  # -3 was not remembered
    with pytest.raises(NameError, match="not defined in the kernel: undefined_here"):
        shell.run_line_magic("ddp", "push undefined_here")
    with pytest.raises(NameError, match="rank 0: nope, kept_not; rank 1: nope, kept_not"):
        shell.run_line_magic("ddp", "pull nope kept_not")
    cell(shell, "print(kept)")
    assert "[rank 1]\n1" in capsys.readouterr().out and _rank_pids() == pids


def test_a_large_push_says_what_it_costs_before_it_starts(monkeypatch):
    import torch

    from commhooks_lab import magics

    monkeypatch.setattr(magics, "LARGE_PUSH_BYTES", 1 << 20)
    with pytest.warns(RuntimeWarning, match=r"%ddp push of 4 MiB: it is pickled through each rank.s pipe"):
        magics._warn_if_large({"big": torch.zeros(4 << 20, dtype=torch.uint8), "small": 3})
    with pytest.warns(RuntimeWarning, match="push of 4 MiB"):
        magics._warn_if_large({"parts": [torch.zeros(1 << 19), {"x": torch.zeros(1 << 19)}]})  # 4 MiB in a list
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        magics._warn_if_large({"small": torch.zeros(100), "text": "x" * 10})


def test_a_cell_that_changes_what_later_runs_need_is_named(shell, capsys):
    cell(shell, "torch.set_default_dtype(torch.float64)")
    assert "set torch's default dtype to torch.float64" in capsys.readouterr().out
    cell(shell, "print(torch.get_default_dtype())")
    assert "[ranks 0, 1]\ntorch.float32" in capsys.readouterr().out
    with pytest.raises(DDPCellError, match="destroyed the ranks' process group"):
        cell(shell, "dist.destroy_process_group()")
    assert "the kernel restarts them" in capsys.readouterr().out
    assert _rank_pids() == []  # stopped: the next cell or run starts ranks with a process group
    cell(shell, "print(dist.is_initialized())")
    assert "[ranks 0, 1]\nTrue" in capsys.readouterr().out


def test_push_and_pull_move_values_both_ways(shell):
    shell.user_ns["scale"] = 2.5
    shell.run_line_magic("ddp", "push scale")
    cell(shell, "scaled = scale * (rank + 1)")
    shell.run_line_magic("ddp", "pull scaled")
    assert shell.user_ns["scaled"] == [2.5, 5.0]
    shell.run_line_magic("ddp", "pull scaled --rank 1")
    assert shell.user_ns["scaled"] == 5.0


def test_a_hang_ends_with_the_launchers_timeout_and_a_fresh_start_after(shell, capsys):
    cell(shell, "before = 1")
    with pytest.raises(lab.WorkerTimeoutError):
        cell(shell, "if rank == 0:\n    dist.barrier()", line="--timeout 3")  # rank 1 never joins
    with pytest.raises(DDPCellError):
        cell(shell, "before")  # the hung ranks were stopped: their namespaces are gone
    assert "NameError" in capsys.readouterr().out
    cell(shell, "print('fresh ranks')")
    assert "fresh ranks" in capsys.readouterr().out


def test_an_interrupt_stops_the_cell_on_every_rank(shell, capsys, keyboard_interrupts):
    """Even a Ctrl-C that does not wake the kernel's wait (it landed on another thread: interrupt_main only sets
    the flag) stops the cell long before the ranks' 30 s timeout would."""
    cell(shell, "before = 1")
    threading.Timer(1.0, _thread.interrupt_main).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        cell(shell, "import time\ntime.sleep(60)")
    assert time.monotonic() - started < 10
    cell(shell, "print('after the interrupt', 'before' in globals())")
    assert "after the interrupt False" in capsys.readouterr().out


def test_reset_forgets_the_namespaces_and_keeps_the_ranks(shell, capsys):
    cell(shell, "gone = 1\nimport os\npid = os.getpid()")
    shell.run_line_magic("ddp", "pull pid")
    pids = shell.user_ns["pid"]
    shell.run_line_magic("ddp", "reset")
    cell(shell, "import os\nprint('gone' in globals(), os.getpid())")
    out = capsys.readouterr().out
    assert all(f"False {pid}" in out for pid in pids)


def test_format_outputs_orders_values_errors_and_skips():
    rows = [
        {"rank": 0, "skipped": False, "out": "a\n", "value": None, "error": None},
        {"rank": 1, "skipped": True},
        {"rank": 2, "skipped": False, "out": "", "value": None, "error": "Traceback ...\nKeyError: 'k'\n"},
    ]
    assert format_outputs(rows) == "[rank 0]\na\n[rank 2] Traceback ...\nKeyError: 'k'\n"


MODEL = """
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)  # each rank its own batches: the exact mean differs from each rank's
def steps(n):
    for _ in range(n):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.randn(16, 8, generator=g)), torch.randint(0, 2, (16,))).backward()
        opt.step()
"""
LOCAL_ONLY = """
def local_only(state, bucket):  # sends nothing: each rank keeps its own gradient
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future
"""


@pytest.mark.parametrize(
    ("hook", "registered"),
    [
        (
            "allreduce",
            "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
            "model.register_comm_hook(None, default_hooks.allreduce_hook)",
        ),
        (
            "fp16",
            "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
            "model.register_comm_hook(None, default_hooks.fp16_compress_hook)",
        ),
        ("local_only", LOCAL_ONLY + "model.register_comm_hook(None, local_only)"),
    ],
)
def test_measure_probes_a_hook_registered_by_hand_one_step_per_backward(shell, capsys, hook, registered):
    """Each backward is a step, measured against the exact mean; steps in later cells count on."""
    shell.run_line_magic("ddp", "reset")
    cell(shell, MODEL)
    capsys.readouterr()
    cell(shell, registered + "\nsteps(2)", line="--measure")
    out = capsys.readouterr().out
    assert out.startswith("[rank 0]\nmeasured by the lab's probe") and "[rank 1]" not in out
    cell(shell, "steps(1)", line="--measure")
    shell.run_line_magic("ddp", "pull measured --rank 0")
    table = shell.user_ns["measured"]
    assert list(table["step"]) == [0, 1, 2]
    bytes_fp32 = table["uncompressed_bytes"]
    assert (bytes_fp32 == 4 * (8 * 16 + 16 + 16 * 2 + 2)).all()
    if hook == "allreduce":
        assert (table["payload_bytes"] == bytes_fp32).all() and (table["rel_error"] < 1e-6).all()
        assert (table["rank_spread"] == 0).all()
    elif hook == "fp16":
        assert (table["payload_bytes"] == bytes_fp32 // 2).all()
        assert ((table["rel_error"] > 0) & (table["rel_error"] < 2.0**-10)).all()  # fp16's rounding, no more
    else:  # the probe compares with the exact mean, so a hook that averages nothing is caught
        assert (table["payload_bytes"] == 0).all()
        assert (table["rank_spread"] > 0).all() and (table["rel_error"] > 0.05).all()


def test_measure_runs_on_every_rank_and_an_error_ends_it_cleanly(shell, capsys):
    with pytest.raises(ValueError, match="drop --rank"):
        cell(shell, "pass", line="--measure --rank 0")
    shell.run_line_magic("ddp", "reset")
    cell(shell, MODEL)
    with pytest.raises(DDPCellError, match="rank 1"):  # the ranks agree not to measure; nothing hangs
        cell(
            shell,
            LOCAL_ONLY + "model.register_comm_hook(None, local_only)\nsteps(1)\nassert rank == 0",
            line="--measure",
        )
    capsys.readouterr()
    cell(shell, "steps(1)", line="--measure")  # the step recorded before the error is measured now, with this one
    assert "measured by the lab's probe" in capsys.readouterr().out
    shell.run_line_magic("ddp", "pull measured --rank 0")
    assert list(shell.user_ns["measured"]["step"]) == [0, 1]

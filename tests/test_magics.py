"""``%%ddp``: cells on the kernel's warm ranks, with namespaces that persist, errors named per rank, hangs and
interrupts that end cleanly, values moved both ways."""

import _thread
import threading

import pytest
from IPython.core.interactiveshell import InteractiveShell

import commhooks_lab as lab
from commhooks_lab.magics import DDPCellError, format_outputs

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


@pytest.fixture(scope="module")
def shell():
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "commhooks_lab")
    ip.run_line_magic("ddp", "start -n 2")
    yield ip
    ip.run_line_magic("ddp", "stop")


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
    with pytest.raises(ValueError, match="ranks are 0..1"):
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


def test_an_interrupt_stops_the_cell_on_every_rank(shell, capsys):
    cell(shell, "before = 1")
    threading.Timer(1.0, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        cell(shell, "import time\ntime.sleep(60)")
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

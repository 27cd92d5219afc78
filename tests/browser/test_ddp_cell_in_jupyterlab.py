"""``%%ddp`` cells in a real browser: JupyterLab 4, headless Debian Chromium, Playwright.

The kernel-side tests (multiprocess/test_magics.py) call the magics from an InteractiveShell; this one writes a small
notebook, opens it in JupyterLab as a participant would, runs it, and reads off the page what the ranks printed:
each rank's own values under its label, a line every rank printed shown once, and a cell that raised on one rank,
named, with its traceback and the DDPCellError. It checks the ranks are there while the cells run, gone after
``%ddp stop``, and that nothing the kernel started outlives the server. A screenshot is saved either way.
"""

from __future__ import annotations

import os
import signal

import nbformat
import psutil
import pytest
from _jupyterlab import SCREENSHOTS, browser_page, open_notebook, run_all_cells, running_jupyterlab, wait_until
from conftest import live_children, session_members, wait_gone

PER_RANK = """\
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
x = torch.tensor([float(rank + 1)])
sent = x.item()
dist.all_reduce(x)
print(f"contributed {sent}, all-reduced {x.item()}")"""
# DDP broadcasts rank 0's parameters when it wraps the model, so every rank prints the same line
SHARED = """\
weights = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.empty_like(weights) for _ in range(world_size)]
dist.all_gather(gathered, weights)
print(f"sum {x.item()}; DDP weights equal on every rank: {all(torch.equal(g, weights) for g in gathered)}")"""
RAISES = """\
%%ddp --rank 1
def check(value):
    raise ValueError(f"rank {rank} refuses {value}")
check(x.item())"""
CELLS = [
    "%load_ext commhooks_lab",
    "%ddp start -n 2",
    "%%ddp\n" + PER_RANK,
    "%%ddp\n" + SHARED,
    RAISES,  # Run All stops here: the stop cell below is run on its own
    "%ddp stop\n%ddp status",
]
RAISES_AT, STOP_AT = CELLS.index(RAISES), len(CELLS) - 1


def kernels(lab) -> list[psutil.Process]:
    """The server's kernels (each the leader of a session of its own, which holds everything it starts)."""
    return [p for p in psutil.Process(lab.server.pid).children() if "ipykernel" in " ".join(p.cmdline())]


def ranks(kernel: psutil.Process) -> set[int]:
    """The kernel's live rank processes: its descendants less multiprocessing's helpers (the rank server)."""
    return live_children(kernel)


@pytest.fixture
def jupyterlab(tmp_path):
    """A private JupyterLab serving the notebook above; after it stops, nothing its kernels started is left."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    notebook.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    source = tmp_path / "source.ipynb"
    nbformat.write(notebook, source)
    sessions: set[int] = set()
    with running_jupyterlab(tmp_path, source, "ddp_cells.ipynb") as lab:
        yield lab
        sessions = {os.getsid(k.pid) for k in kernels(lab)}
    left = wait_gone(set().union(*(session_members(s) for s in sessions)), timeout_s=10.0)
    for pid in left:  # don't leave them to the next test, but fail this one
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the kernel's session left after the server stopped: {sorted(left)}"


@pytest.fixture
def page():
    with browser_page() as page:
        yield page


def outputs(page, index: int) -> str:
    """The text of cell ``index``'s outputs, as rendered."""
    cell = page.locator(".jp-Notebook .jp-CodeCell").nth(index)
    return "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())


def test_ddp_cells_show_each_ranks_output_and_name_the_rank_that_raised(jupyterlab, page):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / "ddp_cells.png"
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    try:
        open_notebook(page, jupyterlab)
        run_all_cells(page, reaches=RAISES_AT)
        cells.nth(RAISES_AT).locator(".jp-OutputArea-output:has-text('DDPCellError')").wait_for(timeout=120_000)

        started = outputs(page, 1)
        assert "2 ranks ready (backend gloo)" in started
        per_rank = outputs(page, 2)
        assert "[rank 0]\ncontributed 1.0, all-reduced 3.0" in per_rank
        assert "[rank 1]\ncontributed 2.0, all-reduced 3.0" in per_rank
        shared = outputs(page, 3)
        assert "[ranks 0, 1]\nsum 3.0; DDP weights equal on every rank: True" in shared
        assert shared.count("sum 3.0") == 1 and "[rank 0]" not in shared and "[rank 1]" not in shared
        raised = outputs(page, RAISES_AT)
        assert "[rank 1] Traceback (most recent call last)" in raised
        assert 'File "<%%ddp cell, rank 1>", line 2, in check' in raised
        assert "ValueError: rank 1 refuses 3.0" in raised
        assert "DDPCellError: the cell raised on rank 1 (traceback above)" in raised
        assert "[rank 0]" not in raised  # --rank 1: rank 0 did not run it
        assert outputs(page, STOP_AT) == ""  # Run All stopped at the error

        (kernel,) = kernels(jupyterlab)
        running = ranks(kernel)
        assert len(running) == 2, "the warm ranks run between cells"
        assert running <= session_members(os.getsid(kernel.pid))  # what the teardown's check looks for
        cells.nth(STOP_AT).locator(".cm-content").click()
        page.keyboard.press("Control+Enter")  # run this cell only, staying on it
        cells.nth(STOP_AT).locator(".jp-OutputArea-output:has-text('not started')").wait_for(timeout=60_000)
        assert "ranks stopped\n2 ranks not started" in outputs(page, STOP_AT)
        wait_until(lambda: not ranks(kernel), 10, "no ranks after %ddp stop")
    finally:
        page.screenshot(path=str(shot), full_page=True)
        print(*(f"--- cell {i}:\n{outputs(page, i)}" for i in range(len(CELLS))), sep="\n")

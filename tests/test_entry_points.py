"""The ways in: a function from a notebook cell, the CLI, and torchrun on a real cluster."""
import os
import shutil
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

NOTEBOOK_CELLS = [
    "import torch, torch.distributed as dist\nimport commhooks_lab",
    # Defined in the notebook's __main__: spawn cannot import it, so it must travel by value.
    "def scaled_sum(ctx, scale):\n"
    "    t = torch.tensor([float(ctx.rank + 1)])\n"
    "    dist.all_reduce(t)\n"
    "    return scale * t.item()",
    "print(commhooks_lab.launch(scaled_sum, 10, world_size=2, start_method='spawn'))",
    "def broken(ctx):\n    raise KeyError('from a cell')",
    "try:\n    commhooks_lab.launch(broken, world_size=2)\n"
    "except commhooks_lab.WorkerError as e:\n    print(type(e).__name__, e.rank, str(e).splitlines()[0])",
]


def test_a_function_defined_in_a_notebook_cell_runs_under_spawn(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    texts = ["".join(o.get("text", "") for o in cell.outputs) for cell in nb.cells]
    assert texts[2] == "[30.0, 30.0]\n"
    assert texts[4] == "WorkerError 0 rank 0 raised KeyError: 'from a cell'\n"


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_main_job_selfcheck_prints_the_agreed_value():
    out = _run([sys.executable, "-m", "commhooks_lab", "selfcheck", "--world-size", "3"])
    assert out.returncode == 0, out.stderr
    assert "3 ranks (gloo)" in out.stdout and "[6.0, 6.0, 6.0], expected 6: OK" in out.stdout


def test_the_same_worker_runs_under_torchrun():
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    out = _run([torchrun, "--nproc-per-node", "2", "-m", "commhooks_lab", "selfcheck"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("self-check") == 1  # rank 0 alone reports
    assert "[3.0, 3.0], expected 3: OK" in out.stdout


def test_launch_from_env_explains_what_is_missing(monkeypatch):
    from commhooks_lab import launch_from_env

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="torchrun --nproc-per-node"):
        launch_from_env(print)

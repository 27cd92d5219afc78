"""The ways in: a function from a notebook cell, the CLI, and torchrun on a real cluster."""

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import nbformat
import pytest
from conftest import session_members, wait_gone
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


def _run(cmd: list[str], timeout: float = 120, cwd=None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command in its own session; on timeout end the whole session (torchrun's ranks too).

    Afterwards nothing of the session may be left: its ranks, even reparented, must be gone.
    """
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True, cwd=cwd
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd} did not finish in {timeout} s\n{out}\n{err}")
    left = wait_gone(session_members(proc.pid), timeout_s=5)
    assert not left, f"{cmd} left processes behind: {sorted(left)}"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_main_job_selfcheck_prints_the_agreed_value():
    out = _run([sys.executable, "-m", "commhooks_lab", "selfcheck", "--world-size", "3"])
    assert out.returncode == 0, out.stderr
    assert "3 ranks (gloo)" in out.stdout and "[6.0, 6.0, 6.0], expected 6: OK" in out.stdout


def in_tmp(tmp_path) -> dict:
    """Our environment with TMPDIR in the test's own folder: torchrun's agent leaves a torchelastic_* folder behind in
    it, which pytest removes with the folder."""
    return {**os.environ, "TMPDIR": str(tmp_path)}


def test_the_same_worker_runs_under_torchrun(tmp_path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    out = _run([torchrun, "--nproc-per-node", "2", "-m", "commhooks_lab", "selfcheck"], env=in_tmp(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("self-check") == 1  # rank 0 alone reports
    assert "[3.0, 3.0], expected 3: OK" in out.stdout


def test_launch_from_env_explains_what_is_missing(monkeypatch):
    from commhooks_lab import launch_from_env

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="torchrun --nproc-per-node"):
        launch_from_env(print)


def test_main_job_compares_hooks_and_writes_its_outputs(tmp_path):
    out = _run([sys.executable, "-m", "commhooks_lab", "--steps", "4", "--quiet", "--out", str(tmp_path)])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    table = {
        line.split()[0]: line.split()
        for line in lines
        if line.split() and line.split()[0] in ("allreduce", "fp16", "bf16", "power_sgd", "batched_power_sgd", "noop")
    }
    assert set(table) == {"allreduce", "fp16", "bf16", "power_sgd", "batched_power_sgd", "noop"}
    assert float(table["allreduce"][1]) < 1e-6 and float(table["fp16"][1]) <= 2**-11
    from commhooks_lab import _compat

    refused = "TypeError: BF16 all reduce communication hook required CUDA" in out.stdout
    assert refused == (_compat.bf16_refusal() is not None), "the refusal is reported where DDP refuses, only there"
    assert (tmp_path / "overview.png").stat().st_size > 10_000
    import commhooks_lab

    assert len(commhooks_lab.load(tmp_path / "results")) == 7


def _main_in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    """``python -m commhooks_lab`` without the interpreter: for refusals that argument checks make, where a
    subprocess would add only its seconds of torch import."""
    from commhooks_lab.cli import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    out = capsys.readouterr()
    return stop.value.code, out.out, out.err


def test_main_job_reports_bad_options_without_a_traceback(capsys):
    code, _, err = _main_in_process(["--hooks", "fp61", "--quiet", "--out", ""], capsys)
    assert code == 2 and "did you mean 'fp16'" in err


@pytest.mark.parametrize(
    "args, says",
    [
        (["--out", "/proc/x"], "--out /proc/x: cannot write the results there"),
        (["--out", "{file}"], "cannot write the results there (Not a directory)"),
        (["--model", "os:getcwd"], "model factory os:getcwd cannot be called as factory(seed) -> Task"),
    ],
)
def test_main_job_refuses_a_bad_out_or_model_before_it_runs(args, says, tmp_path, capsys):
    """Each used to end in a traceback, after the ranks started or after the whole comparison."""
    (tmp_path / "a_file").write_text("not a folder")
    args = [arg.format(file=tmp_path / "a_file") for arg in args]
    code, out, err = _main_in_process(["--hooks", "fp16", "--steps", "2", "--quiet", "--out", str(tmp_path), *args],
                                      capsys)  # fmt: skip
    assert code == 2 and says in err, err[-2000:]
    assert "ranks ready" not in out and not (tmp_path / "summary.csv").exists()


@pytest.mark.parametrize(
    "env, says",
    [
        ({"COMMHOOKS_LAB_SEED_SET": "abc"}, "COMMHOOKS_LAB_SEED_SET='abc': use a whole number"),
        ({"COMMHOOKS_LAB_NUMERICS": "bogus"}, "COMMHOOKS_LAB_NUMERICS='bogus': use one of"),
    ],
)
def test_main_job_refuses_a_bad_environment_before_it_runs(env, says, tmp_path):
    """A fresh interpreter: the package reads these variables from its import on, and used to end in a traceback."""
    out = _run([sys.executable, "-m", "commhooks_lab", "--hooks", "fp16", "--steps", "2", "--quiet", "--out",
                str(tmp_path)], env={**os.environ, **env})  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert says in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "ranks ready" not in out.stdout and not (tmp_path / "summary.csv").exists()


def test_an_unknown_prewarm_setting_is_named_and_starts_nothing():
    out = _run([sys.executable, "-c", "import commhooks_lab"], env={**os.environ, "COMMHOOKS_LAB_PREWARM": "maybe"})
    assert out.returncode == 0 and "COMMHOOKS_LAB_PREWARM='maybe' is not a setting" in out.stderr


def test_main_job_runs_under_torchrun(tmp_path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    out = _run(
        [
            torchrun,
            "--nproc-per-node",
            "2",
            "-m",
            "commhooks_lab",
            "--hooks",
            "allreduce",
            "fp16",
            "--steps",
            "3",
            "--out",
            "",
        ],
        env=in_tmp(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("2 hooks, 2 ranks, 3 steps") == 1
    assert "fp16" in out.stdout


UNGUARDED_SCRIPT = """
    import commhooks_lab as lab

    result = lab.run(hook="fp16", steps=3, cluster=lab.Cluster(start_method="spawn", timeout_s=120))
    print(result.steps["rel_error"].max())
"""


def test_a_script_without_a_main_guard_is_told_the_two_line_fix(tmp_path):
    script = tmp_path / "my_experiment.py"
    script.write_text(textwrap.dedent(UNGUARDED_SCRIPT))
    start = time.monotonic()
    out = _run([sys.executable, str(script)], timeout=180, cwd=tmp_path)
    elapsed = time.monotonic() - start
    assert out.returncode == 1
    # Every rank dies the same way; the first to go is named (on a busy machine not always rank 0).
    assert re.search(
        r"WorkerError: rank \d exited with code 1 while starting, before it could run your code", out.stderr
    )
    assert "every rank first imports the script you ran" in out.stderr
    call = 'result = lab.run(hook="fp16", steps=3, cluster=lab.Cluster(start_method="spawn", timeout_s=120))'
    fix = f'if __name__ == "__main__":\n        {call}\n'
    assert fix in out.stderr  # the user's own line, under the guard
    assert "bootstrapping phase" in out.stderr  # Python's own words, from the rank's stderr
    # the deaths are seen, not waited out: well before the script's 120 s timeout (about 10 s here, quiet; 22 s with
    # the machine three times oversubscribed), interpreter start and imports included
    assert elapsed < 90, f"the error took {elapsed:.1f} s"


def test_ranks_from_the_rank_server_never_import_the_script(tmp_path):
    """The default start method forks ranks from the rank server without the script: no main guard needed."""
    script = tmp_path / "my_experiment.py"
    spawned = ', cluster=lab.Cluster(start_method="spawn", timeout_s=120)'
    script.write_text(textwrap.dedent(UNGUARDED_SCRIPT.replace(spawned, "")))
    out = _run([sys.executable, str(script)], timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert 1e-5 < float(out.stdout) < 1e-2  # fp16's rel_error

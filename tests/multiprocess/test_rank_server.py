"""The rank server: a forkserver preloaded with torch that forks the ranks, and the environment they see."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from _same_run import assert_same_run
from conftest import live_children, wait_gone
from test_session import CASES

import commhooks_lab as lab
from commhooks_lab import Cluster
from commhooks_lab.launcher import rank_server
from commhooks_lab.launcher.environment import PREWARM_VARIABLE

pytestmark = [
    pytest.mark.usefixtures("no_leftover_processes"),
    pytest.mark.skipif(rank_server.DEFAULT_START_METHOD != "forkserver", reason="no forkserver on this platform"),
]


def what_a_rank_sees(ctx):
    import os

    import torch

    from commhooks_lab.launcher import rank_server

    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "threads": torch.get_num_threads(),
        "env": dict(os.environ),
        "prewarm": rank_server.why_not_prewarm(),
    }


def test_ranks_are_forked_by_a_server_that_has_no_threads():
    with Cluster(world_size=2) as cluster:
        rows = cluster.run(what_a_rank_sees)
        server = cluster._server
        assert server is not None and {row["ppid"] for row in rows} == {server.pid}
        assert len(os.listdir(f"/proc/{server.pid}/task")) == 1  # it has imported torch, and forks single-threaded
        assert set(cluster.pids) <= live_children()  # the leftover check sees ranks a forkserver forked
    assert server.running()  # the server stays for the next start


def test_the_ranks_see_the_notebooks_environment_when_they_start(monkeypatch):
    rank_server.default_server()  # the server's environment is fixed from here on
    monkeypatch.setenv("LAB_SET_AFTER_IMPORT", "seen")
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the lab's one thread per rank wins, as under spawn
    monkeypatch.delenv("HOME", raising=False)
    with Cluster(world_size=2, env={"LAB_FROM_CLUSTER": "too"}) as cluster:
        rows = cluster.run(what_a_rank_sees)
    for rank, row in enumerate(rows):
        env = row["env"]
        assert env["LAB_SET_AFTER_IMPORT"] == "seen" and env["LAB_FROM_CLUSTER"] == "too"
        assert "HOME" not in env
        assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1" and row["threads"] == 1
        assert env["RANK"] == str(rank) and env[PREWARM_VARIABLE] == "0"
        assert row["prewarm"] is not None  # a rank never starts a server of its own


def test_other_import_time_variables_get_a_server_of_their_own():
    default = rank_server.default_server()
    with Cluster(world_size=2, env={"OMP_NUM_THREADS": "2"}) as cluster:
        rows = cluster.run(what_a_rank_sees)
        own = cluster._server
    try:
        assert own is not default and default.running() and {row["ppid"] for row in rows} == {own.pid}
        assert [row["env"]["OMP_NUM_THREADS"] for row in rows] == ["2", "2"]
        server_env = open(f"/proc/{own.pid}/environ", "rb").read().split(b"\0")
        assert b"OMP_NUM_THREADS=2" in server_env  # there when the server imported torch
    finally:
        own.stop()
    assert not own.running()


def test_a_server_that_cannot_start_says_so(tmp_path):
    (tmp_path / "torch.py").write_text("import sys\nsys.stderr.write('fake torch refuses\\n')\nsys.exit(3)\n")
    with pytest.raises(
        rank_server.RankServerError, match="exited before it forked a rank.*fake torch refuses.*start_method='spawn'"
    ):
        Cluster(world_size=2, env={"PYTHONPATH": str(tmp_path)})
    rank_server.stop_all()


def test_a_dead_server_is_replaced():
    server = rank_server.default_server()
    lab.launch(what_a_rank_sees)  # it has preloaded torch
    dead = server.pid
    os.kill(dead, signal.SIGKILL)
    wait_gone([dead])
    rows = lab.launch(what_a_rank_sees)
    assert {row["ppid"] for row in rows} == {server.pid} and server.pid != dead and server.running()


def _fresh_interpreter(code: str, environ: dict[str, str] | None = None, **env) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**(os.environ if environ is None else environ), **env},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


PREWARMED = """
    import json, sys, threading
    import commhooks_lab
    from commhooks_lab.launcher import rank_server
    for thread in threading.enumerate():
        if thread.name == "commhooks-prewarm":
            thread.join()
    print(json.dumps({
        "why": rank_server.why_not_prewarm(),
        "pids": [s.pid for s in rank_server._servers.values()],
        "imported": "commhooks_lab.experiment" in sys.modules and "torch" in sys.modules,
    }))
"""


#: How a notebook kernel looks to the package: an IPython shell exists before the import.
AS_A_KERNEL = "from IPython.core.interactiveshell import InteractiveShell; InteractiveShell.instance()\n"


@pytest.mark.parametrize(
    "env, kernel, why",
    [
        ({PREWARM_VARIABLE: "1"}, False, None),
        ({}, True, None),
        ({}, False, "not an interactive kernel"),
        ({PREWARM_VARIABLE: "0"}, True, f"{PREWARM_VARIABLE}='0'"),
        ({PREWARM_VARIABLE: "1", "RANK": "0", "LOCAL_RANK": "0"}, True, "under torchrun"),
    ],
)
def test_importing_the_package_starts_a_server_only_in_an_interactive_main_interpreter(env, kernel, why):
    inherited = {k: v for k, v in os.environ.items() if k != PREWARM_VARIABLE}
    code = (AS_A_KERNEL if kernel else "") + textwrap.dedent(PREWARMED)
    out = json.loads(_fresh_interpreter(code, environ=inherited, **env))
    if why is None:
        assert out["why"] is None and len(out["pids"]) == 1
        assert out["imported"]  # the kernel's share of a run, imported in the background
        assert wait_gone(out["pids"], timeout_s=10) == set()  # it leaves with the interpreter that started it
    else:
        assert out["why"].startswith(why) and out["pids"] == [] and not out["imported"]


NO_CHILDREN_AFTER = """
    import contextlib, io, json, os, runpy, sys
    sys.argv = ["commhooks_lab", *json.loads(sys.argv[1])]
    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
        runpy.run_module("commhooks_lab", run_name="__main__")
    children = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            stat = open(f"/proc/{pid}/stat").read()
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                children.append(stat.split(")")[0])
    print(json.dumps(children))
"""


@pytest.mark.parametrize(
    "argv, env, starts",
    [
        (["--help"], {}, False),
        (["compare", "--help"], {}, False),
        (["selfcheck", "--help"], {}, False),
        (["--help"], {PREWARM_VARIABLE: "1"}, True),  # the control: the check sees a prewarmed rank server
    ],
)
def test_the_command_line_help_starts_no_process(argv, env, starts):
    inherited = {k: v for k, v in os.environ.items() if k != PREWARM_VARIABLE}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NO_CHILDREN_AFTER), json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**inherited, **env},
    )
    assert out.returncode == 0, out.stderr
    assert bool(json.loads(out.stdout)) is starts, out.stdout


def test_a_spawned_rank_does_not_start_a_server():
    rows = lab.launch(what_a_rank_sees, start_method="spawn")
    assert all(row["prewarm"] is not None for row in rows)


SPAWN_CASES = ["fp16", "power_sgd", "qsgd+EF", "randomk+EF", "accelerate power_sgd", "fsdp2 bf16"]


def test_ranks_from_the_server_give_the_numbers_spawned_ranks_give():
    pytest.importorskip("accelerate")
    with Cluster(world_size=2, start_method="spawn") as spawned:
        by_spawn = [lab.run(steps=3, cluster=spawned, **CASES[name]) for name in SPAWN_CASES]
    for name, other in zip(SPAWN_CASES, by_spawn):
        forked = lab.run(steps=3, **CASES[name])
        assert forked.env["start_method"] == "forkserver" and other.env["start_method"] == "spawn"
        assert_same_run(forked, other)

"""Two torchrun agents on one host (``--nnodes 2 --nproc-per-node 5``): world size 10, more ranks
than the lab would start on this machine, as on a real cluster. The laptop's limits must not apply."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import session_members, wait_gone

from commhooks_lab.launcher.cluster import child_environment
from commhooks_lab.launcher.options import max_local_world_size

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

NODES, PER_NODE = 2, 5
WORLD_SIZE = NODES * PER_NODE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_agents(
    target: list[str], tmp: Path, per_node: int = PER_NODE, timeout: float = 150
) -> list[subprocess.CompletedProcess]:
    """Run ``torchrun ... target`` as node 0 and node 1 on 127.0.0.1, ``per_node`` ranks each; end both sessions
    on a timeout. TMPDIR is ``tmp``: each agent leaves a torchelastic_* folder behind there, removed with it."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    port = _free_port()
    env = {**os.environ, **child_environment(), "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp)}
    agents = [
        subprocess.Popen(
            [torchrun, "--nnodes", str(NODES), "--nproc-per-node", str(per_node), "--node-rank", str(node)]
            + ["--master-addr", "127.0.0.1", "--master-port", str(port), *target],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # the agent and its ranks: one process group to end on a timeout
        )
        for node in range(NODES)
    ]
    outputs = []
    try:
        for agent in agents:
            out, err = agent.communicate(timeout=timeout)
            outputs.append(subprocess.CompletedProcess(agent.args, agent.returncode, out, err))
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.communicate()
    for agent in agents:  # the ranks too, even those an agent left orphaned
        left = wait_gone(session_members(agent.pid), timeout_s=5)
        assert not left, f"torchrun node left processes behind: {sorted(left)}"
    return outputs


def test_two_agents_run_the_main_job_with_world_size_10(tmp_path):
    node0, node1 = _two_agents(
        ["-m", "commhooks_lab", "--hooks", "fp16", "power_sgd", "--steps", "3", "--quiet", "--out", ""], tmp_path
    )
    assert node0.returncode == 0, node0.stderr[-3000:]
    assert node1.returncode == 0, node1.stderr[-3000:]
    assert node0.stdout.count(f"3 hooks, {WORLD_SIZE} ranks, 3 steps") == 1  # rank 0 alone reports
    assert "hooks," not in node1.stdout
    names = ("fp16", "power_sgd r1", "power_sgd r4")
    table = {
        name: line[len(name) :].split()
        for line in node0.stdout.splitlines()
        for name in names
        if line.startswith(name + " ")
    }
    assert set(table) == set(names), node0.stdout
    assert float(table["fp16"][0]) < 1e-3  # rel_error: fp16 roundoff, summed over ten ranks
    assert all("True" in cells for cells in table.values())  # ranks_agree on all ten ranks


def test_the_laptop_limits_are_not_checked_when_the_ranks_are_given():
    from commhooks_lab import ExperimentConfig

    config = ExperimentConfig(hook="fp16", world_size=max_local_world_size() + 1)
    with pytest.raises(ValueError, match="torchrun"):
        config.check()
    assert config.check(local=False).name == "fp16"
    with pytest.raises(ValueError, match="at least 1"):
        config.replace(world_size=0).check(local=False)  # what holds everywhere is still checked


SCRIPT = """
    import json, os

    import torch
    import torch.distributed as dist

    from commhooks_lab import launch_from_env


    def where_am_i(ctx, offset):
        value = torch.tensor([ctx.rank + offset])
        dist.all_reduce(value)
        return {"rank": ctx.rank, "world_size": ctx.world_size, "local_rank": ctx.local_rank,
                "backend": ctx.backend, "device": str(ctx.device), "sum": value.item(), "pid": os.getpid()}


    if __name__ == "__main__":
        rows = launch_from_env(where_am_i, 1.0)
        if rows is not None:
            print(json.dumps(rows))
"""


def test_two_agents_run_a_user_function_through_launch_from_env(tmp_path):
    """Two ranks per node: what this test checks (ranks, local ranks, one process each, the all-reduce) holds at any
    size, and the ten ranks of the test above cost each of their ten interpreters' start-up again."""
    per_node = 2
    world_size = NODES * per_node
    script = tmp_path / "my_job.py"
    script.write_text(textwrap.dedent(SCRIPT))
    node0, node1 = _two_agents([str(script)], tmp_path, per_node=per_node)
    assert node0.returncode == 0, node0.stderr[-3000:]
    assert node1.returncode == 0, node1.stderr[-3000:]
    assert node1.stdout.strip() == ""  # values come back on rank 0 only
    rows = json.loads(node0.stdout.strip().splitlines()[-1])
    assert [r["rank"] for r in rows] == list(range(world_size))
    assert {r["world_size"] for r in rows} == {world_size}
    assert [r["local_rank"] for r in rows] == list(range(per_node)) * NODES
    assert {(r["backend"], r["device"]) for r in rows} == {("gloo", "cpu")}
    assert {r["sum"] for r in rows} == {world_size * (world_size + 1) / 2}
    assert len({r["pid"] for r in rows}) == world_size

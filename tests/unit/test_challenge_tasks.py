"""The challenge's task sets by name: a score says which set it was made on, so scores compare only within one."""

import pytest

from commhooks_lab.challenge.score import BASELINES, NODES_BASELINES, baseline_specs
from commhooks_lab.challenge.tasks import (
    NODES_TASK_SET,
    REFERENCE_NETWORK,
    TASK_SET,
    TASK_SETS,
    TASKS,
    ChallengeTask,
    task_set_of,
    tasks_of,
)
from commhooks_lab.cli import build_parser


def test_each_set_is_named_and_a_custom_one_says_what_it_holds():
    assert task_set_of(TASKS) == TASK_SET and tasks_of(TASK_SET) == TASKS
    nodes = tasks_of(NODES_TASK_SET)
    assert nodes[:2] == TASKS and nodes[2] == ChallengeTask("wide", steps=30, world_size=4, nodes=2)
    assert task_set_of(nodes) == NODES_TASK_SET and task_set_of(list(nodes)) == NODES_TASK_SET
    assert task_set_of(TASKS[:1]) == "custom: wide (30 steps, seed 0)", "not the default's name"
    assert nodes[2].name == "wide, 2 nodes" and nodes[2].run_options()["nodes"] == 2
    assert "nodes" not in TASKS[0].run_options(), "a flat task asks for no nodes"
    with pytest.raises(ValueError, match="no task set 'nodes': choose one of 'hook-challenge-1', 'hook-challenge-no"):
        tasks_of("nodes")


def test_the_nodes_set_adds_a_hierarchical_baseline_and_describes_both_levels():
    assert baseline_specs(TASKS) == BASELINES
    assert baseline_specs(tasks_of(NODES_TASK_SET)) == BASELINES | NODES_BASELINES
    net = REFERENCE_NETWORK.two_level(tasks_of(NODES_TASK_SET)[2])
    assert (net.nodes, net.ranks_per_node, net.inter_gbps, net.intra_gbps) == (2, 2, 1.0, 10.0)
    assert REFERENCE_NETWORK.describe() == "1 Gbit/s per rank, 5 µs per hop (α/β model, not measured)"
    assert "10 Gbit/s per rank inside a node" in REFERENCE_NETWORK.describe(nodes=True)


def test_the_command_line_takes_a_set_by_name_and_refuses_others(capsys):
    parser = build_parser()
    assert parser.parse_args(["challenge", "score", "entry.py"]).task_set == TASK_SET
    args = parser.parse_args(["challenge", "leaderboard", "dir", "--task-set", NODES_TASK_SET])
    assert args.task_set == NODES_TASK_SET and set(TASK_SETS) == {TASK_SET, NODES_TASK_SET}
    with pytest.raises(SystemExit):
        parser.parse_args(["challenge", "score", "entry.py", "--task-set", "nodes"])
    assert "invalid choice: 'nodes'" in capsys.readouterr().err

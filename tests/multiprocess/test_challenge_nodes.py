"""The challenge's two-node task: 2 nodes of 2 ranks by name only (no link, so no namespaces needed), timed by the
two-level model from every rank's bytes and ring steps inside and between nodes, the busiest rank's time scored."""

import pytest

import commhooks_lab as lab
from commhooks_lab.challenge.score import score, score_task
from commhooks_lab.challenge.tasks import REFERENCE_NETWORK, ChallengeTask
from commhooks_lab.launcher import Cluster
from commhooks_lab.studies.network import two_level_seconds

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

NODES = ChallengeTask("cnn", steps=4, world_size=4, nodes=2)


@pytest.fixture(scope="module")
def four():
    with Cluster(world_size=4, nodes=2) as cluster:
        yield cluster


def test_all_reduce_is_the_reference_and_compressing_between_nodes_only_beats_compressing_everywhere(four):
    flat, half, hier = (score(h, tasks=(NODES,), cluster=four) for h in ("allreduce", "fp16", "hierarchical_fp16"))
    assert flat.tasks[0]["speed"] == 1.0, "every rank's counted bytes and hops are all-reduce's rule"
    assert hier.tasks[0]["speed"] > half.tasks[0]["speed"] > 1.0, (hier.tasks, half.tasks)
    assert hier.label == "hierarchical fp16" and flat.tasks[0]["task"] == "cnn, 2 nodes"
    assert "10 Gbit/s per rank inside a node" in flat.network
    assert flat.task_set == "custom: cnn, 2 nodes (4 steps, seed 0)"


def test_the_busiest_rank_sets_the_time_not_rank_0(four):
    """A hook whose node leaders are ranks 1 and 3: rank 0 sends nothing between nodes, rank 1 does."""
    from _challenge_hooks import leaders_off_rank_zero, second_rank_leads

    result = lab.run(hook=leaders_off_rank_zero, state_factory=second_rank_leads, cluster=four, **NODES.run_options())
    counts = result.final["link_totals"]
    assert counts[0]["inter_bytes"] == 0 and counts[0]["inter_hops"] == 0, counts[0]
    assert counts[1]["inter_bytes"] > 0 and counts[1]["inter_hops"] == 2 * NODES.steps, counts[1]  # 2(N-1) a step
    assert counts[0]["intra_hops"] == 2 * NODES.steps, "a reduce and a broadcast in a node of 2: one hop each"
    net = REFERENCE_NETWORK.two_level(NODES)
    part = score_task(result, NODES)
    assert part["t_hook_s"] == two_level_seconds(counts[1], net) > two_level_seconds(counts[0], net)
    assert part["rank_spread"] == 0 and result.ranks_agree


def test_the_sandbox_scores_the_two_node_task_as_the_learner_does(tmp_path, four):
    """The two-node task runs in the sandbox too (no link: nothing its namespaces refuse), with the same bits."""
    import inspect

    import _challenge_hooks as hooks

    from commhooks_lab.challenge.sandbox import Budget, score_file

    entry = tmp_path / "leaders_off_rank_zero.py"
    entry.write_text(
        "import torch\nimport torch.distributed as dist\n\n\n"
        + "\n\n".join(inspect.getsource(f) for f in (hooks.second_rank_leads, hooks.leaders_off_rank_zero))
        + "\n\nmake_state = second_rank_leads\nhook = leaders_off_rank_zero\n"
    )
    boxed = score_file(entry, tasks=(NODES,), budget=Budget(wall_s=120, stall_s=10, memory_bytes=2 << 30))
    own = score(hooks.leaders_off_rank_zero, state_factory=hooks.second_rank_leads, tasks=(NODES,), cluster=four)
    assert boxed.value is not None, boxed.disqualified
    assert boxed.fingerprint == own.fingerprint and boxed.tasks == own.tasks

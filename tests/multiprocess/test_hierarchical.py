"""Issue 49, item 2: hierarchical hooks. Sum inside each node, one inter-node leg (float32, fp16, PowerSGD, top-k),
broadcast inside; subgroups made once; the probe's bytes inside and between nodes.

Four plain ranks (one Cluster for the module) check the numbers, with the node size given as ``ranks_per_node``;
one run on two nodes by name only (no link, so no namespaces needed) checks the byte and hop columns, which need the
ranks to know their nodes.
"""

from __future__ import annotations

import pytest

import commhooks_lab as lab
from commhooks_lab.hooks.compressors import TopK
from commhooks_lab.hooks.hierarchical import node_size
from commhooks_lab.launcher import WorkerError

pytestmark = pytest.mark.usefixtures("no_leftover_processes")
W = 4
#: the MLP's parameter shapes (digits 64-128-10): the top-k leg's payload, by TopK's own byte rule
MLP_SHAPES = [(128, 64), (128,), (10, 128), (10,)]


@pytest.fixture(scope="module")
def four():
    with lab.Cluster(world_size=W) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def runs(four):
    """Three steps of each, on the same four ranks and data: name -> Result."""
    specs = {
        "flat": "allreduce",
        "2x2": "hierarchical[ranks_per_node=2]",
        "4x1": "hierarchical[ranks_per_node=1]",
        "1x4": "hierarchical",  # the ranks' LOCAL_WORLD_SIZE: 4, one node
        "fp16 2x2": "hierarchical_fp16[ranks_per_node=2]",
        "flat fp16": "fp16",
        "psgd 2x2": "hierarchical_power_sgd[ranks_per_node=2,start_powerSGD_iter=2]",
        "flat psgd": "power_sgd[start_powerSGD_iter=2]",
    }
    results = lab.compare(list(specs.values()), steps=3, world_size=W, cluster=four)
    return dict(zip(specs, results))


def test_the_float32_leg_is_the_flat_mean_to_float32_rounding(runs):
    """2 nodes x 2: the same addends (each gradient / W) summed in another order, so equal to float32 rounding,
    not bit for bit: gloo's ring sums each chunk around the ring, the hook (g0 + g1) + (g2 + g3)."""
    flat, hier = runs["flat"].steps, runs["2x2"].steps
    assert (hier["rel_error"] < 2**-22).all() and (flat["rel_error"] < 2**-22).all(), hier["rel_error"]
    assert (hier["rank_spread"] == 0).all(), "every rank gets the leader's broadcast: the same bits"
    assert runs["2x2"].ranks_agree


def test_one_rank_per_node_is_the_flat_all_reduce_bit_for_bit(runs):
    """No node group, and the leaders' group is every rank in order: the same all-reduce of the same addends."""
    assert runs["4x1"].final["param_digests"] == runs["flat"].final["param_digests"]


def test_one_node_is_right_too(runs):
    """nodes=1 (LOCAL_WORLD_SIZE = the world): a reduce and a broadcast inside the one node, no leg between."""
    one = runs["1x4"].steps
    assert (one["rel_error"] < 2**-22).all() and (one["rank_spread"] == 0).all()
    assert (one["inter_bytes"] == 0).all(), "one node: nothing crosses"


def test_the_fp16_legs_error_is_fp16s_size(runs):
    """Only the node sums are rounded to 16 bits (once each, and the sum of two), so the error is of the order of
    fp16's unit roundoff 2^-11, like the flat fp16 hook's, and far above float32's."""
    hier, flat = runs["fp16 2x2"].steps["rel_error"], runs["flat fp16"].steps["rel_error"]
    assert (hier > 2**-16).all() and (hier < 2**-10).all(), hier.tolist()
    assert hier.max() < 2 * flat.max(), (hier.tolist(), flat.tolist())
    assert (runs["fp16 2x2"].steps["rank_spread"] == 0).all()


def test_powersgd_between_nodes_is_flat_powersgd_up_to_rounding(runs):
    """PowerSGD is linear in the gradients it is given: P = sum M Q is the same summed by node first, its
    orthonormal basis does not see the leaders' 1/W scale, Q = sum M^T P comes out 1/N of flat's (the hook multiplies
    by N), and a node's error feedback is the sum of its ranks' would-be residuals / W. So the two agree but for
    float32 rounding, while they differ from the exact mean by far more."""
    hier, flat = runs["psgd 2x2"].steps["rel_error"], runs["flat psgd"].steps["rel_error"]
    assert flat.iloc[-1] > 0.1, "step 2 compresses at matrix rank 1 (steps 0-1: plain all-reduce, both exact)"
    assert abs(hier.iloc[-1] - flat.iloc[-1]) <= 1e-6 * flat.iloc[-1], (hier.tolist(), flat.tolist())
    assert (hier.iloc[:-1] < 2**-22).all()


def _count_new_groups(ctx, steps: int) -> dict:
    """Build the hook's state twice and run ``steps`` steps, counting ``new_group`` calls in each part."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d
    from torch.nn.parallel import DistributedDataParallel as DDP

    from commhooks_lab.hooks import hierarchical
    from commhooks_lab.hooks.choice import build_hook, check_hook_choice

    made = []
    original = distributed_c10d.new_group

    def counting(*args, **kwargs):
        made.append(1)
        return original(*args, **kwargs)

    hierarchical._SUBGROUPS.clear()  # other runs on these ranks made theirs already: start from none
    distributed_c10d.new_group = counting
    try:
        choice = check_hook_choice("hierarchical_topk", None, {"ranks_per_node": 2}, None, "torch")
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)))
        hook, state = build_hook(choice)
        at_build = len(made)
        model.register_comm_hook(state, hook)
        for _ in range(steps):
            model(torch.randn(4, 8)).sum().backward()
        in_steps = len(made) - at_build
        build_hook(choice)  # a second run on the same ranks and node size
        again = len(made) - at_build - in_steps
    finally:
        distributed_c10d.new_group = original
    return {"at_build": at_build, "in_steps": in_steps, "again": again, "leader": state.leaders is not None,
            "rank": dist.get_rank()}  # fmt: skip


def test_subgroups_are_made_once_not_per_step(four):
    rows = four.run(_count_new_groups, 4)
    for row in rows:
        # two node groups and the leaders' group, every rank calling new_group for each, in order
        assert (row["at_build"], row["in_steps"], row["again"]) == (3, 0, 0), row
    assert [row["leader"] for row in rows] == [True, False, True, False]


def test_a_node_size_that_does_not_divide_the_world_is_refused(four, monkeypatch):
    with pytest.raises(WorkerError, match=r"ranks_per_node=3 does not divide the world of 4 ranks"):
        lab.run(hook="hierarchical[ranks_per_node=3]", steps=1, world_size=W, cluster=four)
    with pytest.raises(ValueError, match="ranks_per_node must be an int >= 0"):
        lab.run(hook="hierarchical[ranks_per_node=-1]", steps=1, world_size=W, cluster=four)  # before any rank
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="needs the node size"):
        node_size(0, 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE=3 does not divide the world of 4 ranks"):
        node_size(0, 4)
    assert node_size(0, 1) == 1 and node_size(2, 4) == 2


def test_bytes_and_hops_inside_and_between_nodes_follow_the_rule():
    """On 2 nodes x 2 (by name only: the counts need no link), rank 0 (node 0's leader), per step, S the float32
    bucket: the flat all-reduce's ring bytes 2(W-1)/W S all between nodes (its group spans them); the hierarchical
    hook's reduce ((L-1)/L S on the leader) and broadcast (S) inside, and its leg between: 2(N-1)/N of the float32,
    the fp16, or the top-k payload (all-gathered: (N-1) x it). The ring steps the probe counts per level are the
    ones the two-level model infers from the calls."""
    specs = ["allreduce", "hierarchical", "hierarchical_fp16", "hierarchical_topk"]
    flat, f32, f16, topk = lab.compare(specs, steps=3, world_size=W, nodes=2, fresh=True)
    assert any("on 2 nodes of 2 by name only" in note for note in flat.notes), flat.notes
    s = flat.steps["uncompressed_bytes"].iloc[0]
    inside = s / 2 + s
    expected = {
        "flat": (flat, 0, 2 * 3 / 4 * s),
        "float32": (f32, inside, s),
        "fp16": (f16, inside, s / 2),
        "topk": (topk, inside, sum(TopK(0.01).payload_bytes(shape) for shape in MLP_SHAPES)),
    }
    shapes = lab.network.parameter_shapes(lab.models.build_task("mlp", 0).model)
    net = lab.network.TwoLevelNetwork(1.0, 100.0, 5.0, 1.0, nodes=2, ranks_per_node=2)
    for name, (result, intra, inter) in expected.items():
        steps = result.steps
        rule = lab.network.two_level_rule(shapes, result.config["hook"], result.config["state_options"])
        assert (rule["intra_bytes"], rule["inter_bytes"]) == (intra, inter), (name, rule)  # the model's rule too
        assert (steps["intra_bytes"] == intra).all() and (steps["inter_bytes"] == inter).all(), (
            name, steps[["intra_bytes", "inter_bytes"]].values.tolist(), intra, inter)  # fmt: skip
        assert (steps["intra_bytes"] + steps["inter_bytes"] == steps["ring_bytes"]).all(), name
        inferred = lab.network.two_level_hops(rule, net)
        assert (steps["inter_hops"] == inferred[0]).all() and (steps["intra_hops"] == inferred[1]).all(), (
            name, steps[["inter_hops", "intra_hops"]].values.tolist(), inferred)  # fmt: skip
    assert (f32.steps["rel_error"] < 2**-22).all() and (flat.steps["rel_error"] < 2**-22).all()
    assert (topk.steps["rank_spread"] == 0).all()

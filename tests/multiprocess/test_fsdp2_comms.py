"""FSDP2's custom reduce-scatter and HSDP's replica all-reduce hook, run on real gloo ranks.

Each compressed path is held to PyTorch's own path with the compression off (bit for bit where the
arithmetic is the same), to the float64 mean of the ranks' gradients, and to the bytes its collectives carry.
"""

import pytest
import torch
from conftest import live_children

import commhooks_lab as lab
from commhooks_lab import Cluster
from commhooks_lab.engine.fsdp2_comm_spec import fsdp2_traffic
from commhooks_lab.engine.fsdp2_comms import Wire16ReduceScatter, fsdp2_comms_job, module_shapes
from commhooks_lab.launcher import netns_switch

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

MLP_PARAMETERS = 9610
STEPS = 3
LONGER = 8


def _runs(world_size: int, setups: list[str], longer: tuple[str, ...] = (), nodes: int = 2) -> dict:
    """``STEPS`` steps of each setup, and ``LONGER`` steps of each in ``longer`` (keyed ``name@LONGER``)."""
    with Cluster(world_size=world_size) as cluster:
        runs = {name: cluster.run(fsdp2_comms_job, name, STEPS, 0, "mlp", 32, nodes) for name in setups}
        runs.update({f"{name}@{LONGER}": cluster.run(fsdp2_comms_job, name, LONGER) for name in longer})
        return runs


@pytest.fixture(scope="module")
def two_ranks():
    return _runs(
        2,
        [
            "default",
            "rs_fp32",
            "rs_fp32_force_sum",
            "rs_fp16",
            "rs_bf16",
            "reduce_dtype_fp16",
            "rs_fp16_reduce_dtype_fp16",
        ],
        longer=("rs_fp16", "rs_fp16_ef"),
    )


@pytest.fixture(scope="module")
def four_ranks():
    return _runs(4, ["default", "rs_fp32", "hsdp", "hsdp_hook_fp32", "hsdp_hook_fp16", "hsdp_native_with_hook"])


@pytest.fixture(scope="module")
def three_nodes():
    return _runs(6, ["hsdp", "hsdp_hook_fp32", "hsdp_hook_fp16"], nodes=3)


def _column(run: list, name: str) -> list:
    return [row.get(name, 0) for row in run[0]["rows"]]


def _same_grads(a: list, b: list) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a[0]["grads"], b[0]["grads"], strict=True))


def test_every_rank_ends_each_step_with_the_same_gradient(two_ranks, four_ranks):
    for run in [*two_ranks.values(), *four_ranks.values()]:
        assert all(_same_grads(run, [rank]) for rank in run[1:])


def test_a_float32_custom_reduce_scatter_gives_the_default_paths_gradients_bit_for_bit(two_ranks):
    """Two addends sum the same in any order, and AVG divides by 2 exactly: the plumbing is all that can differ."""
    assert _same_grads(two_ranks["default"], two_ranks["rs_fp32"])
    assert sum(_column(two_ranks["rs_fp32"], "reduce_scatter_single_bytes")) == 0  # the comm replaced it


def test_the_custom_comm_follows_fsdps_op_and_its_divisions(two_ranks):
    """SUM with FSDP's post-divide (forced sums), and float16 buffers pre-divided by FSDP, as PyTorch's own path."""
    assert _same_grads(two_ranks["default"], two_ranks["rs_fp32_force_sum"])
    # float16 buffers: the float32 sum of two float16 values rounded once is what gloo's float16 sum gives
    assert _same_grads(two_ranks["reduce_dtype_fp16"], two_ranks["rs_fp16_reduce_dtype_fp16"])


def test_at_four_ranks_only_the_order_of_the_float32_sums_differs(four_ranks):
    default, custom = four_ranks["default"][0]["grads"], four_ranks["rs_fp32"][0]["grads"]
    for d, c in zip(default, custom, strict=True):
        assert torch.allclose(d, c, rtol=1e-5, atol=1e-8)


def test_16_bits_on_the_wire_halve_the_reduce_scatters_bytes(two_ranks):
    default, fp16 = two_ranks["default"], two_ranks["rs_fp16"]
    assert _column(default, "reduce_scatter_single_bytes") == [MLP_PARAMETERS * 4] * STEPS
    assert _column(fp16, "all_to_all_single_bytes") == [MLP_PARAMETERS * 2] * STEPS
    assert _column(fp16, "reduce_scatter_single_bytes") == [0] * STEPS
    assert _column(fp16, "all_gather_single_bytes") == _column(default, "all_gather_single_bytes")  # parameters
    # what gloo really wrote: its reduce-scatter all-reduces the whole input; the all-to-all sends (W-1)/W of it
    assert max(_column(fp16, "wire_bytes")) < min(_column(two_ranks["rs_fp32"], "wire_bytes"))
    assert max(_column(two_ranks["rs_fp32"], "wire_bytes")) < min(_column(default, "wire_bytes"))


def test_float32_sums_beat_fsdp2s_own_float16_reduction(two_ranks):
    """FSDP2's reduce_dtype=float16 rounds each input and the sum; the custom comm rounds only each input."""
    wire16 = _column(two_ranks["rs_fp16"], "rel_error")
    own16 = _column(two_ranks["reduce_dtype_fp16"], "rel_error")
    assert all(0 < w <= 2**-11 for w in wire16)  # within float16's unit roundoff
    assert all(w < o for w, o in zip(wire16, own16))
    assert all(2**-11 < b <= 2**-8 for b in _column(two_ranks["rs_bf16"], "rel_error"))
    assert all(e < 1e-6 for e in _column(two_ranks["default"], "rel_error"))


def test_error_feedback_cancels_the_roundings_over_steps(two_ranks):
    """Each step errs more (it also sends the last rounding), but the sum of the steps' gradients stays close."""
    plain, fed = two_ranks[f"rs_fp16@{LONGER}"], two_ranks[f"rs_fp16_ef@{LONGER}"]
    assert _column(fed, "rel_error")[0] == _column(plain, "rel_error")[0]  # nothing fed back yet
    assert sum(_column(fed, "rel_error")[1:]) > sum(_column(plain, "rel_error")[1:])
    # the drift of the summed gradients: bounded by one residual with feedback, a random walk without
    assert _column(fed, "cumulative_rel_error")[-1] < 0.6 * _column(plain, "cumulative_rel_error")[-1]
    assert _column(fed, "all_to_all_single_bytes") == _column(plain, "all_to_all_single_bytes")  # same bytes


def test_hsdp_through_the_hook_in_float32_is_native_hsdp_bit_for_bit(four_ranks):
    """Shard inside a node, average across nodes in the hook: (a+b)/2 then (x+y)/2, as FSDP2's native HSDP does."""
    assert _same_grads(four_ranks["hsdp"], four_ranks["hsdp_hook_fp32"])
    assert sum(_column(four_ranks["hsdp_hook_fp32"], "all_reduce_bytes")) == 0


def test_the_replica_hook_halves_the_bytes_between_nodes_and_leaves_those_inside(four_ranks):
    native, fp16 = four_ranks["hsdp"], four_ranks["hsdp_hook_fp16"]
    # inside a node: the same float32 reduce-scatter of every gradient (2 shards per node)
    assert _column(fp16, "reduce_scatter_single_bytes") == _column(native, "reduce_scatter_single_bytes")
    assert _column(native, "all_reduce_bytes") == [MLP_PARAMETERS * 4 // 2] * STEPS  # each rank's float32 shard
    # between nodes, on the busiest link: a float32 ring all-reduce over 2 replicas sends the whole shard ...
    between_native = _column(native, "all_reduce_bytes")
    inside = [r - b for r, b in zip(_column(native, "ring_bytes"), between_native)]
    # ... the hook's all-to-all and all-gather send half of it (float16; each module's shard padded to 2 pieces)
    between_fp16 = [r - i for r, i in zip(_column(fp16, "ring_bytes"), inside)]
    for b16, b32 in zip(between_fp16, between_native):
        assert b32 / 2 <= b16 <= b32 / 2 + 8
    errors = _column(fp16, "rel_error")
    assert all(2**-20 < e <= 2**-10 for e in errors)  # two float16 roundings: the shard and the mean


def test_the_replica_hook_is_right_on_three_nodes_too(three_nodes):
    """Three addends: the hook's float32 sum is native HSDP's up to the order of the additions."""
    for run in three_nodes.values():
        assert all(_same_grads(run, [rank]) for rank in run[1:])
    native, hooked = three_nodes["hsdp"][0]["grads"], three_nodes["hsdp_hook_fp32"][0]["grads"]
    assert all(torch.allclose(n, h, rtol=1e-5, atol=1e-8) for n, h in zip(native, hooked, strict=True))
    assert all(2**-20 < e <= 2**-10 for e in _column(three_nodes["hsdp_hook_fp16"], "rel_error"))
    assert sum(_column(three_nodes["hsdp_hook_fp16"], "all_reduce_bytes")) == 0


def test_a_hook_on_native_hsdp_runs_after_its_float32_all_reduce(four_ranks):
    """set_all_reduce_hook on a 2-D mesh cannot replace the replica all-reduce: it is handed its output."""
    native, hooked = four_ranks["hsdp"], four_ranks["hsdp_native_with_hook"]
    assert _column(hooked, "all_reduce_bytes") == _column(native, "all_reduce_bytes")
    # the replicas' values are already equal, so the float16 hook gives back each value rounded to float16
    assert torch.equal(hooked[0]["grads"][0], native[0]["grads"][0].half().float())


def test_the_custom_comm_refuses_what_it_cannot_do(cluster):
    def refusals(ctx):
        import torch.distributed as dist

        comm, out = Wire16ReduceScatter(torch.float16), []
        for op, async_op in [(dist._make_nccl_premul_sum(0.5), False), (dist.ReduceOp.SUM, True)]:
            try:
                comm(torch.empty(2), torch.ones(4), dist.group.WORLD, op, async_op=async_op)
            except ValueError as e:
                out.append(str(e))
        shared = Wire16ReduceScatter(torch.float16, error_feedback=True)  # one memory handed two modules' gradients
        shared(torch.empty(2), torch.ones(4), dist.group.WORLD, dist.ReduceOp.AVG)
        try:
            shared(torch.empty(3), torch.ones(6), dist.group.WORLD, dist.ReduceOp.AVG)
        except ValueError as e:
            out.append(str(e))
        return out

    said = cluster.run(refusals)[0]
    assert "SUM or AVG only" in said[0] and "synchronously" in said[1]
    assert "holds a gradient of 4 values and was handed 6" in said[2] and "its own" in said[2]
    with pytest.raises(ValueError, match="torch.float16, torch.bfloat16 or torch.float32"):
        Wire16ReduceScatter(torch.int8)


# -- the same comms from the lab's front door: lab.run / lab.compare(api="fsdp2", fsdp2_comm=...) ---------------------

WHY_NOT = netns_switch.why_unavailable()
needs_links = pytest.mark.skipif(WHY_NOT is not None, reason=f"no private network here: {WHY_NOT}")
#: Nodes behind a fast uplink: the topology is what matters here (the groups, the bytes), not the rate.
ON_NODES = {"world_size": 4, "nodes": 2, "link": "1gbit"}
FLAT_COMMS = [
    None,
    "wire16_reduce_scatter[dtype=float32]",
    "wire16_reduce_scatter",
    "wire16_reduce_scatter[error_feedback=true]",
]
NODE_COMMS = [None, "wire16_reduce_scatter[dtype=bfloat16]", "hsdp", "hsdp_wire16[dtype=float32]", "hsdp_wire16"]


def _through_the_lab(comms: list, cluster: Cluster, **topology) -> dict:
    results = lab.compare([{"fsdp2_comm": c} for c in comms], api="fsdp2", steps=STEPS, cluster=cluster, **topology)
    return dict(zip(comms, results, strict=True))


@pytest.fixture(scope="module")
def lab_two_ranks(cluster):
    return _through_the_lab(FLAT_COMMS, cluster)


@pytest.fixture(scope="module")
def lab_on_nodes():
    with Cluster(**ON_NODES) as cluster:
        return _through_the_lab(NODE_COMMS, cluster, **ON_NODES)


def _rule(result) -> dict:
    from commhooks_lab.engine.models import build_task

    config = result.config
    shapes = module_shapes(build_task(config["model"], config["seed"]).model)
    return fsdp2_traffic(config["fsdp2_comm"], shapes, config["world_size"], config["nodes"], "float32")


def _counted_columns(steps) -> list[str]:
    ignored = {"ring_bytes", "uncompressed_bytes", "wire_bytes"}
    return sorted(c for c in steps.columns if c.endswith("_bytes") and c not in ignored)


def _check_rule(result) -> None:
    """Every counted column, every step, is the byte rule's number (payload by op, and the node split)."""
    rule, steps = _rule(result), result.steps
    assert _counted_columns(steps) == sorted(rule)
    for column in _counted_columns(steps):
        assert (steps[column] == rule[column]).all(), (result.name, column, list(steps[column]), rule[column])


def test_lab_run_uses_the_custom_reduce_scatter_and_measures_it_like_a_ddp_hook(lab_two_ranks):
    default, fp32, fp16 = (lab_two_ranks[c] for c in FLAT_COMMS[:3])
    assert default.name == "allreduce" and fp16.name == "allreduce+wire16_reduce_scatter float16"
    assert any("set_custom_reduce_scatter" in n for n in fp16.notes)
    for result in lab_two_ranks.values():
        assert (result.steps["rank_spread"] == 0).all() and result.ranks_agree
        steps = result.steps  # one node: every byte stays inside it
        assert (steps["intra_bytes"] == steps["ring_bytes"]).all() and (steps["inter_bytes"] == 0).all()
    # float32 on the wire: the default path's arithmetic at 2 ranks, every step's error to the last bit
    assert list(fp32.steps["rel_error"]) == list(default.steps["rel_error"]) and not fp32.steps["compressing"].any()
    assert (fp32.steps["all_to_all_single_bytes"] == MLP_PARAMETERS * 4).all()
    assert "reduce_scatter_single_bytes" not in fp32.steps  # the comm replaced FSDP2's reduce-scatter
    errors = fp16.steps["rel_error"]
    assert ((errors > 2**-20) & (errors <= 2**-11)).all() and fp16.steps["compressing"].all()
    assert (fp16.steps["ring_bytes"] < default.steps["ring_bytes"]).all()
    assert (fp16.steps["wire_bytes"] < default.steps["wire_bytes"]).all()


def test_rank_spread_sees_ranks_that_end_with_other_gradients(cluster):
    """The column the runs above hold at 0 is not 0 by construction: ranks 1 apart read 1."""

    def spread(ctx):
        from commhooks_lab.engine.fsdp2 import _rank_spread

        return _rank_spread(torch.full((3,), float(ctx.rank), dtype=torch.float64))

    assert cluster.run(spread) == [1.0, 1.0]


def test_error_feedback_through_the_lab_keeps_the_summed_gradients_closer(lab_two_ranks):
    plain, fed = lab_two_ranks[FLAT_COMMS[2]], lab_two_ranks[FLAT_COMMS[3]]
    assert fed.name.endswith("float16 error_feedback")
    assert fed.steps["rel_error"].iloc[0] == plain.steps["rel_error"].iloc[0]  # nothing fed back yet
    assert fed.steps["cumulative_rel_error"].iloc[-1] < 0.7 * plain.steps["cumulative_rel_error"].iloc[-1]


def test_each_comms_byte_rule_is_the_bytes_counted_at_two_ranks(lab_two_ranks):
    for result in lab_two_ranks.values():
        _check_rule(result)


@needs_links
def test_on_two_nodes_hsdp_and_its_replica_hook_run_through_the_lab(lab_on_nodes):
    flat, native, hooked32, hooked16 = (
        lab_on_nodes[c] for c in (None, "hsdp", "hsdp_wire16[dtype=float32]", "hsdp_wire16")
    )
    for result in lab_on_nodes.values():
        assert (result.steps["rank_spread"] == 0).all() and result.ranks_agree
        assert any("2 nodes" in n for n in result.notes)
        _check_rule(result)
    # the float32 hook is native HSDP bit for bit ((a+b)/2 then (x+y)/2); 16 bits halve what crosses the nodes
    assert list(hooked32.steps["rel_error"]) == list(native.steps["rel_error"])
    assert (hooked32.steps["intra_bytes"] == native.steps["intra_bytes"]).all()
    assert (native.steps["inter_bytes"] == MLP_PARAMETERS * 4 // 2).all()  # a 2-replica ring of the float32 shard
    half = native.steps["inter_bytes"] / 2  # and 16 bits: half, but for each module's shard padded to 2 pieces
    assert ((half <= hooked16.steps["inter_bytes"]) & (hooked16.steps["inter_bytes"] <= half + 8)).all()
    assert ((hooked16.steps["rel_error"] > 2**-20) & (hooked16.steps["rel_error"] <= 2**-10)).all()
    # flat FSDP's every collective spans both nodes: all its ring bytes count as between them
    assert (flat.steps["inter_bytes"] == flat.steps["ring_bytes"]).all() and (flat.steps["intra_bytes"] == 0).all()
    bf16 = lab_on_nodes["wire16_reduce_scatter[dtype=bfloat16]"]
    assert ((bf16.steps["rel_error"] > 2**-11) & (bf16.steps["rel_error"] <= 2**-8)).all()


def test_the_byte_rule_pads_each_shard_as_fsdp2_does():
    """Rows split ceil(d0/W) per rank, the root re-gathers nothing: the counted numbers above are not a fluke."""
    odd = [([(5, 3), (5,)], True), ([(7,)], False)]  # a 5-row layer and a root with its own 7-vector
    rule = fsdp2_traffic(None, odd, 4)
    assert rule["all_gather_single_bytes"] == 4 * (2 * 3 + 2)  # 2 of 5 rows (padded), the root's none
    assert rule["reduce_scatter_single_bytes"] == 4 * 4 * (2 * 3 + 2 + 2)
    hsdp = fsdp2_traffic("hsdp_wire16[dtype=bfloat16]", odd, 4, nodes=2)
    # shards over a node's 2 ranks: 3 of 5 rows x 3 + 3 = 12 and 4 of 7; each cut into 2 pieces, 6 and 2
    assert hsdp["reduce_scatter_single_bytes"] == 4 * 2 * (12 + 4) and hsdp["all_gather_single_bytes"] == 4 * 12
    assert hsdp["all_to_all_single_bytes"] == 2 * 2 * (6 + 2) and hsdp["all_gather_bytes"] == 2 * (6 + 2)
    # between nodes: half the all-to-all and the whole all-gather; inside: half the reduce-scatter, the re-gather
    assert hsdp["inter_bytes"] == 16 + 16 and hsdp["intra_bytes"] == 64 + 48
    assert fsdp2_traffic(None, odd, 1)["payload_bytes"] == 0  # one rank: FSDP2 copies


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"fsdp2_comm": "wire16_reduce_scatter"}, r"FSDP2's communication and api='torch' runs DDP.*pass api='fsdp2'"),
        ({"api": "fsdp2", "fsdp2_comm": "hsdp"}, r"is HSDP.*needs nodes=2 or more with 2 or more ranks each.*nodes=1"),
        ({"api": "fsdp2", "fsdp2_comm": "hsdp_wire16", "world_size": 4, "nodes": 4, "link": "1gbit"},
         r"\(1 rank\(s\) per node\)"),
        ({"api": "fsdp2", "fsdp2_comm": "hsdp_wire16", "hook": "fp16", **ON_NODES}, "use hook='allreduce'"),
        ({"api": "fsdp2", "hook": "power_sgd", "fsdp2_comm": "wire16_reduce_scatter"}, r"api='fsdp2' takes hook in"),
        ({"api": "fsdp2", "fsdp2_comm": "wire16_allreduce"}, r"unknown fsdp2_comm 'wire16_allreduce'"),
        ({"api": "fsdp2", "fsdp2_comm": "hsdp[dtype=float16]"}, "it takes no options"),
        ({"api": "fsdp2", "fsdp2_comm": "wire16_reduce_scatter[ratio=2]"}, r"unknown option 'ratio'"),
        ({"api": "fsdp2", "fsdp2_comm": "wire16_reduce_scatter[dtype=int8]"}, "dtype is the format on the wire"),
        ({"api": "fsdp2", "fsdp2_comm": "wire16_reduce_scatter[error_feedback=1]"}, "must be true or false"),
        ({"api": "fsdp2", "fsdp2_comm": 16}, "fsdp2_comm must be a name"),
    ],
)  # fmt: skip
def test_a_bad_fsdp2_comm_is_refused_before_any_process_starts(options, says, monkeypatch):
    monkeypatch.setattr(netns_switch, "why_unavailable", lambda: None)  # checked, not built, here
    before = live_children()
    with pytest.raises((ValueError, TypeError), match=says):
        lab.ExperimentConfig(**options).check()
    with pytest.raises((ValueError, TypeError), match=says):
        lab.run(steps=1, fresh=True, **options)
    assert live_children() == before


def test_under_torchrun_hsdp_is_refused_as_it_needs_the_lab_s_nodes():
    with pytest.raises(ValueError, match="needs nodes=2 or more"):
        lab.ExperimentConfig(api="fsdp2", fsdp2_comm="hsdp", world_size=4).check(local=False)

"""Precision at scale: the one-process replay agrees with real ranks, and the 16-bit-wire/fp32-sum hook
keeps the bytes of a 16-bit all-reduce while its error stops growing with the number of ranks."""

import pytest
import torch

import commhooks_lab as lab
from commhooks_lab.hooks.low_precision import Wire16State, ring_hook, wire16_sum32_hook
from commhooks_lab.studies import precision as scaling

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def bf16_state(process_group):
    return Wire16State(torch.bfloat16, process_group)


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_replay_is_the_arithmetic_real_ranks_do(world_size):
    grads = scaling.local_gradients("mlp", world_size)
    exact = grads.double().mean(dim=0)
    replay = {
        m: scaling.rel_error(scaling.reduce_16bit(grads, torch.bfloat16, m), exact) for m in ("ring", "wire16_sum32")
    }
    ring, wire = lab.compare(
        [
            {"hook": ring_hook, "state_factory": bf16_state, "label": "ring"},
            {"hook": wire16_sum32_hook, "state_factory": bf16_state, "label": "wire16"},
        ],
        steps=1,
        world_size=world_size,
    )
    assert ring.steps["rel_error"].iloc[0] == pytest.approx(replay["ring"], rel=1e-9)
    assert wire.steps["rel_error"].iloc[0] == pytest.approx(replay["wire16_sum32"], rel=1e-9)
    assert ring.ranks_agree and wire.ranks_agree


def test_the_ring_order_is_not_glooes_order():
    """At 3 ranks gloo's bf16 all-reduce rounds differently from a ring: the curves need the ring hook."""
    grads = scaling.local_gradients("mlp", 3)
    ring_error = scaling.rel_error(scaling.reduce_16bit(grads, torch.bfloat16, "ring"), grads.double().mean(dim=0))
    gloo = lab.run(hook="bf16", steps=1, world_size=3)
    assert gloo.steps["rel_error"].iloc[0] != pytest.approx(ring_error, rel=1e-6)


def test_error_grows_with_world_size_on_a_ring_and_stays_flat_with_fp32_sums():
    table = scaling.precision_vs_world_size(world_sizes=(2, 8, 16), dtypes=(torch.bfloat16,)).set_index("world_size")
    assert table.loc[16, "ring"] > table.loc[8, "ring"] > table.loc[2, "ring"]
    assert table.loc[8, "wire16_sum32"] < table.loc[8, "ring"]  # the "error ordering at W=8"
    assert table["wire16_sum32"].max() <= 1.5 * table.loc[2, "wire16_sum32"]
    # the floor and the bound bracket every method
    for method in ("ring", "wire16_sum32"):
        assert (table["one_rounding"] <= table[method]).all() and (table[method] <= table["bound"]).all()
    assert (table["one_rounding"] <= 2**-8).all()


def test_wire16_sum32_moves_the_bytes_of_a_bf16_all_reduce():
    wire, bf16 = lab.compare([{"hook": wire16_sum32_hook, "state_factory": bf16_state, "label": "w"}, "bf16"], steps=2)
    # 9,610 MLP gradients, W = 2 divides them: no padding
    assert (wire.steps["ring_bytes"] == bf16.steps["ring_bytes"]).all()
    assert (bf16.steps["payload_bytes"] == 9610 * 2).all()
    assert (wire.steps["payload_bytes"] == 9610 * 2 + 9610).all()  # all-to-all of all, all-gather of half


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown method"):
        scaling.reduce_16bit(torch.zeros(2, 4), torch.bfloat16, "tree")


def test_the_registry_offers_the_new_hooks_and_fsdp2s_hook_points():
    table = lab.available_hooks().set_index("name")
    for name in ("ring16", "wire16_sum32"):
        assert table.loc[name, "kind"] == "hook" and table.loc[name, "runs_here"]
    points = table[table["kind"] == "fsdp2 hook point"]
    assert {
        "MixedPrecisionPolicy(reduce_dtype=bfloat16)",
        "set_gradient_divide_factor",
        "set_all_reduce_hook",
        "set_force_sum_reduction_for_comms",
        "set_custom_reduce_scatter",
    } <= set(points.index)
    assert (points["needs"] != "").all()
    # the lab's own ReduceScatter is set on a one-rank model and called; the others ran on it and say so
    assert points.loc["set_custom_reduce_scatter", "runs_here"]
    assert points.loc["set_custom_reduce_scatter", "note"].startswith("called: the lab builds one, Wire16ReduceScatter")
    stepped = points.drop("set_custom_reduce_scatter")
    assert stepped["runs_here"].all() and stepped["note"].str.contains("one-rank").all()
    wire = lab.run(hook="wire16_sum32", state_options={"dtype": "float16"}, steps=1)
    assert wire.name == "wire16_sum32 float16" and 0 < wire.steps["rel_error"].iloc[0] <= 2**-10
    with pytest.raises(ValueError, match="'bfloat16' or 'float16'"):
        lab.ExperimentConfig(hook="ring16", state_options={"dtype": "float32"}).check()

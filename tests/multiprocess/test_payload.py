"""Every torch.distributed call that moves tensor data is counted once, by its input, and the counts
agree with the bytes the rank process really wrote (wire_bytes, from /proc/self/io)."""

import sys

import _collective_hooks as hooks
import pytest

import commhooks_lab as lab
from commhooks_lab.measure import payload

pytestmark = pytest.mark.usefixtures("no_leftover_processes")
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="wire_bytes reads /proc/self/io")

B = hooks.N * 4  # bytes of one tensor the hooks hand in

#: hook -> (payload_bytes, ring_bytes, collective_calls) on rank 0 of two, per step, from the rules in
#: commhooks_lab.measure.payload: inputs count, outputs never; ring = what a bandwidth-optimal algorithm sends.
EXPECTED = {
    "all_reduce_positional": (B, B, 1),  # 2(W-1)/W = 1
    "all_reduce_keyword": (B, B, 1),
    "all_reduce_positional_group": (B, 0, 1),  # a group of one rank: W = 1, nothing to send
    "all_reduce_async_in_callback": (2 * B, 2 * B, 2),  # the second starts on gloo's callback thread
    "all_reduce_coalesced": (2 * B, 2 * B, 1),
    "all_gather": (B, B, 1),  # (W-1) x input
    "all_gather_keyword": (B, B, 1),
    "all_gather_single": (B, B, 1),
    "all_gather_into_tensor": (B, B, 1),  # wraps all_gather_single: counted once
    "all_gather_coalesced": (B, B, 1),
    "reduce_scatter": (2 * B, B, 1),  # input less this rank's own chunk
    "reduce_scatter_single": (2 * B, B, 1),
    "reduce_scatter_tensor": (2 * B, B, 1),  # wraps reduce_scatter_single: counted once
    "all_to_all": (2 * B, B, 1),
    "all_to_all_single": (2 * B, B, 1),
    "all_to_all_single_uneven": (2 * B, 170 * 4, 1),  # keeps 30 of 200 elements
    "broadcast_from_0": (B, B, 1),
    "broadcast_from_1": (0, 0, 1),  # receive-only: an output buffer
    "reduce_to_0": (B, B / 2, 1),  # the destination sends (W-1)/W (reduce-scatter, then gather)
    "reduce_to_1": (B, B, 1),
    "gather_to_0": (B, 0, 1),  # the destination's own part stays
    "gather_to_1": (B, B, 1),
    "scatter_from_0": (2 * B, B, 1),
    "scatter_from_1": (0, 0, 1),
    "send_from_0": (B, B, 1),
    "send_from_1": (0, 0, 1),  # recv: 0 bytes sent; its inner irecv is not counted again
    "isend_irecv": (B, B, 2),
    "batch_isend_irecv": (B, B, 1),  # its isend/irecv calls are inside it: counted once
}
GATHERS = {"all_gather", "all_gather_keyword", "all_gather_single", "all_gather_into_tensor", "all_gather_coalesced"}


@pytest.fixture(scope="module")
def collectives(cluster):
    configs = [
        {"hook": getattr(hooks, name), **({"state_factory": hooks.group_of_rank0} if "group" in name else {})}
        for name in EXPECTED
    ]
    results = lab.compare(configs + [hooks.all_gather_object], steps=2, measure=False, cluster=cluster)
    return {r.name: r for r in results}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_collective_counts_its_input_once_with_its_ring_factor(collectives, name):
    payload_bytes, ring_bytes, calls = EXPECTED[name]
    steps = collectives[name].steps
    assert list(steps["payload_bytes"]) == [payload_bytes] * 2
    assert list(steps["ring_bytes"]) == [ring_bytes] * 2
    assert list(steps["collective_calls"]) == [calls] * 2
    assert list(steps["allgather_bytes"]) == [payload_bytes if name in GATHERS else 0] * 2


@linux_only
@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_counted_calls_explain_the_bytes_written(collectives, name):
    result = collectives[name]
    assert (result.steps["wire_bytes"] >= 0).all()
    assert not [n for n in result.notes if n.startswith("wire_bytes:")], result.steps["wire_bytes"].tolist()


def test_object_collectives_count_the_tensors_they_send(collectives):
    """all_gather_object is not patched: its two all_gather calls are (sizes as int64, then the pickle)."""
    steps = collectives["all_gather_object"].steps
    assert list(steps["collective_calls"]) == [2, 2]
    assert list(steps["allgather_bytes"]) == list(steps["payload_bytes"])
    assert (steps["payload_bytes"] > 8).all()


@linux_only
def test_a_process_group_method_is_unseen_by_the_counter_and_the_result_says_so(cluster):
    result = lab.run(hook=hooks.through_the_process_group, steps=2, cluster=cluster)
    assert (result.steps["payload_bytes"] == 0).all()
    assert (result.steps["wire_bytes"] >= result.steps["uncompressed_bytes"]).all()  # one fp32 all-reduce, W=2
    (note,) = [n for n in result.notes if n.startswith("wire_bytes:")]
    assert "in 2 of 2 steps" in note and "ProcessGroup method" in note


@linux_only
def test_ddp_s_own_allreduce_unmeasured_is_named_in_the_wire_note(cluster):
    result = lab.run(hook="no", measure=False, steps=2, cluster=cluster)
    assert (result.steps["payload_bytes"] == 0).all()
    assert any(n.startswith("wire_bytes:") and "DDP's built-in C++ allreduce" in n for n in result.notes)


POWER_SGD = {"matrix_approximation_rank": 2, "start_powerSGD_iter": 2}
BUILT_IN = [
    "no",
    "allreduce",
    "fp16",
    "bf16",
    {"hook": "power_sgd", "state_options": POWER_SGD},
    {"hook": "batched_power_sgd", "state_options": POWER_SGD},
    "noop",
]


def check_wire_against_ring(results, world_size):
    """gloo writes ring_bytes plus 288 B per message, 2(W-1) messages per all-reduce; at W > 2 its ring
    chunks are whole elements, so a call may send up to 2(W-1) elements (<= 8 B each) more or less."""
    overhead = payload.GLOO_BYTES_PER_MESSAGE * 2 * (world_size - 1)
    for result in results:
        s = result.steps
        gap = s["wire_bytes"] - s["ring_bytes"] - overhead * s["collective_calls"]
        tolerance = 0 if world_size == 2 else 2 * (world_size - 1) * 8
        assert (gap.abs() <= tolerance * s["collective_calls"]).all(), (result.name, gap.tolist())
        assert not [n for n in result.notes if n.startswith("wire_bytes:")], result.name
    power_sgd = [r for r in results if r.name.startswith("power_sgd")][0].steps
    assert power_sgd["compressing"].iloc[-1] and power_sgd["collective_calls"].iloc[-1] > 1


@linux_only
def test_wire_bytes_match_the_counted_ring_bytes_for_every_built_in_hook(cluster):
    check_wire_against_ring(lab.compare(BUILT_IN, steps=3, cluster=cluster), 2)


@linux_only
def test_wire_bytes_match_the_counted_ring_bytes_on_four_ranks():
    results = lab.compare(BUILT_IN, steps=3, world_size=4)
    check_wire_against_ring(results, 4)
    allreduce = results.by_name("allreduce").steps
    assert (allreduce["ring_bytes"] == 1.5 * allreduce["payload_bytes"]).all()  # 2(W-1)/W at W = 4


def test_counting_rules_cover_every_data_moving_call_in_torch_distributed():
    import torch.distributed as dist

    moving = {
        "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_single", "all_gather_into_tensor",
        "all_gather_coalesced", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all",
        "all_to_all_single", "broadcast", "reduce", "gather", "scatter", "send", "recv", "isend", "irecv",
        "batch_isend_irecv",
    }  # fmt: skip
    assert moving <= set(payload.RULES)
    assert all(hasattr(dist, name) for name in payload.RULES if not name.startswith("_"))

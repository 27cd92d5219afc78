"""Notebook 10's checks on their three paths, with plausible wrong hooks run on 4 real ranks."""

import pytest
import torch
import torch.distributed as dist

import commhooks_lab as lab
from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import precision_at_scale as ex
from commhooks_lab.studies import precision as scaling

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


@pytest.fixture(scope="module")
def cluster():
    with lab.Cluster(world_size=4) as c:
        yield c


def stub(state, bucket):
    raise NotImplementedError


def bf16_allreduce(state, bucket):  # plausible and wrong: bf16 all-reduce, sums in bf16 (gloo's order)
    buffer = bucket.buffer()
    wire = buffer.div(dist.get_world_size()).to(state.dtype)
    dist.all_reduce(wire)
    buffer.copy_(wire)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


sums_in_bf16 = ex.scaffold(lambda b, w: b / w, ex._sum_in_16_bits)  # plausible and wrong: 16-bit sums
scaffolded = ex.scaffold


def fp32_wire(state, bucket):  # plausible and wrong: the same collectives, in float32
    return scaffolded(lambda b, w: b / w)(type(state)(torch.float32, state.process_group), bucket)


@pytest.mark.parametrize(
    "attempt, hint",
    [
        (bf16_allreduce, "Yours hands less"),
        (fp32_wire, "Yours hands more"),
        (sums_in_bf16, "add the received pieces in float32"),
        (scaffolded(lambda b, w: b, lambda rows, w, dtype: (rows.float().sum(0) / w).to(dtype)), "after the sum"),
        (scaffolded(lambda b, w: b), "W times the mean"),
        (scaffolded(lambda b, w: (b / w).bfloat16()), "use state.dtype"),  # right on the bfloat16 run only
        (scaffolded(lambda b, w: b / w, gather=False), "the ranks disagree"),
    ],
    ids=["bf16_allreduce", "fp32_wire", "sums_in_bf16", "divide_after", "no_divide", "hard_coded_bf16", "no_gather"],
)
def test_wire16_hook_wrong_answers_get_their_own_hint(attempt, hint, cluster):
    outcome = ex.check_wire16_hook(attempt, cluster=cluster)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message


def test_wire16_hook_check_on_its_three_paths(cluster):
    assert ex.check_wire16_hook(stub, cluster=cluster).status == NOT_ATTEMPTED
    wrong = ex.check_wire16_hook(bf16_allreduce, cluster=cluster)
    assert wrong.status == WRONG and "one all-to-all of the whole bucket" in wrong.message
    from commhooks_lab.hooks.low_precision import wire16_sum32_hook

    assert ex.check_wire16_hook(wire16_sum32_hook, cluster=cluster).status == RIGHT


def fake_table(smallest, largest):
    import pandas as pd

    return pd.DataFrame({"dtype": ["bfloat16", "bfloat16"], "world_size": [2, 16], "ring": [smallest, largest]})


def test_growth_prediction_on_its_three_paths():
    table = scaling.precision_vs_world_size(world_sizes=(2, 16), dtypes=(torch.bfloat16,))
    assert ex.growth_answer(table) == "grows"
    assert ex.check_growth_prediction(None, table).status == NOT_ATTEMPTED
    wrong = ex.check_growth_prediction("flat", table)
    assert wrong.status == WRONG and "grows" not in wrong.message
    assert ex.check_growth_prediction("grows", table).status == RIGHT


@pytest.mark.parametrize(
    "wrong, table, hint",
    [
        ("flat", fake_table(2e-3, 6e-3), "what each extra hop adds"),  # the notebook's wrong choice
        ("grows", fake_table(2e-3, 2.1e-3), "barely moves"),  # the other one, were the table flat
        ("grow", fake_table(2e-3, 6e-3), "'grow' is not one of the choices"),
        ("Grows", fake_table(2e-3, 6e-3), "spelt exactly so"),
        (True, fake_table(2e-3, 6e-3), "not the bool True"),
        (3.0, fake_table(2e-3, 6e-3), "not the float 3.0"),
    ],
)
def test_growth_wrong_and_malformed_answers_get_their_own_message(wrong, table, hint):
    outcome = ex.check_growth_prediction(wrong, table)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert "(W+1)u" not in outcome.message

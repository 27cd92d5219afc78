"""Notebook 9's checks on their three paths, with plausible wrong hooks run on 4 real ranks."""

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


def sums_in_bf16(state, bucket):  # plausible and wrong: the right traffic, but the sum rounds in 16 bits
    world = dist.get_world_size()
    buffer = bucket.buffer()
    piece = -(-buffer.numel() // world)
    wire = torch.zeros(world * piece, dtype=state.dtype)
    wire[: buffer.numel()] = buffer.div(world)
    received = torch.empty_like(wire)
    dist.all_to_all_single(received, wire)
    rows = received.view(world, piece)
    summed = rows[0].clone()
    for row in rows[1:]:
        summed += row  # one bf16 rounding per addition (tensor.sum would accumulate in float32)
    gathered = torch.empty_like(wire)
    dist.all_gather(list(gathered.view(world, piece).unbind()), summed)
    buffer.copy_(gathered[: buffer.numel()])
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


def test_wire16_hook_check_on_its_three_paths(cluster):
    assert ex.check_wire16_hook(stub, cluster=cluster).status == NOT_ATTEMPTED
    wrong = ex.check_wire16_hook(bf16_allreduce, cluster=cluster)
    assert wrong.status == WRONG and "one all-to-all of the whole bucket" in wrong.message
    wrong = ex.check_wire16_hook(sums_in_bf16, cluster=cluster)
    assert wrong.status == WRONG and "add the received pieces in float32" in wrong.message
    from commhooks_lab.hooks.low_precision import wire16_sum32_hook

    assert ex.check_wire16_hook(wire16_sum32_hook, cluster=cluster).status == RIGHT


def test_growth_prediction_on_its_three_paths():
    table = scaling.precision_vs_world_size(world_sizes=(2, 16), dtypes=(torch.bfloat16,))
    assert ex.growth_answer(table) == "grows"
    assert ex.check_growth_prediction(None, table).status == NOT_ATTEMPTED
    wrong = ex.check_growth_prediction("flat", table)
    assert wrong.status == WRONG and "grows" not in wrong.message
    assert ex.check_growth_prediction("grows", table).status == RIGHT

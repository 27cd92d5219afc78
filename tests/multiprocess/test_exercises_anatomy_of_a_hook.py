"""Notebook 2's exercise checks on their three paths: not attempted, wrong (plausible mistakes), right."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from commhooks_lab import exercises
from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import anatomy_of_a_hook as anatomy

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

SEEN = [  # what the notebook's hook records: one bucket at step 0, three after the rebuild
    {"step": 0, "index": 0, "is_last": True, "parameters": "conv.weight, conv.bias, fc1.weight, fc1.bias, fc2.weight"},
    {"step": 1, "index": 0, "is_last": False},
    {"step": 1, "index": 1, "is_last": False},
    {"step": 1, "index": 2, "is_last": True},
]


def test_first_step_buckets_prediction_on_its_three_paths():
    assert anatomy.check_first_step_buckets(None, SEEN).status == NOT_ATTEMPTED
    wrong = anatomy.check_first_step_buckets(4, SEEN)  # the plausible answer: 39,720 B / 10,485 B per bucket
    assert wrong.status == WRONG and "compute_bucket_size_limits" in wrong.message
    right = anatomy.check_first_step_buckets(1, SEEN)
    assert right.status == RIGHT and "rebuilds" in right.message


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (3, "once DDP has rebuilt them"),  # what the later steps use
        (5, "one bucket per parameter"),
        (0, "The hook was called at step 0"),
        (4, "compute_bucket_size_limits"),  # 39,720 B over a 10,485 B cap: the general hint
        (2, "compute_bucket_size_limits"),
        ("1", "a whole number"),
        (True, "a whole number"),  # True == 1 in Python, and still not an answer
        (1.5, "a whole number"),
        (-1, "at least 0"),
    ],
)
def test_first_step_buckets_wrong_answers_get_their_own_hint(wrong, hint):
    outcome = anatomy.check_first_step_buckets(wrong, SEEN)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert "sys.maxsize" not in outcome.message  # the hint points at the source, never answers


def test_the_bucket_answer_is_read_from_what_the_hook_saw():
    two_at_first = [{"step": 0}, {"step": 0}, {"step": 1}]
    assert anatomy.check_first_step_buckets(2, two_at_first).status == RIGHT


def stub(state, bucket):
    """Cast, all-reduce the sum, divide afterwards."""
    raise NotImplementedError


def no_cast(state, bucket):  # wrong: float32 on the wire
    buffer = bucket.buffer()
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: buffer.div_(dist.get_world_size()))


def divide_in_half_after(state, bucket):  # right, written differently: divide the float16 sum, then cast back
    buffer = bucket.buffer()
    future = dist.all_reduce(buffer.half(), async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0].div_(dist.get_world_size()).float())


def divide_by_two_after(state, bucket):  # plausible and wrong: right on two ranks only
    buffer = bucket.buffer()
    future = dist.all_reduce(buffer.half(), async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0].div_(2).float())


def bf16_wire(state, bucket):  # plausible and wrong: the other 16-bit format
    buffer = bucket.buffer()
    future = dist.all_reduce(buffer.to(torch.bfloat16), async_op=True).get_future()
    return future.then(lambda fut: buffer.copy_(fut.value()[0]).div_(dist.get_world_size()))


def divides_twice(state, bucket):  # plausible and wrong: PyTorch's divide-first, and the exercise's divide-after
    buffer, world = bucket.buffer(), dist.get_world_size()
    future = dist.all_reduce(buffer.half().div_(world), async_op=True).get_future()
    return future.then(lambda fut: buffer.copy_(fut.value()[0]).div_(world))


def only_rank_0_divides(state, bucket):
    buffer = bucket.buffer()
    future = dist.all_reduce(buffer.half(), async_op=True).get_future()
    return future.then(
        lambda fut: buffer.copy_(fut.value()[0]).div_(dist.get_world_size() if dist.get_rank() == 0 else 1)
    )


def raises_inside(state, bucket):
    raise ValueError("boom")


def test_divide_after_check_on_its_three_paths(cluster, capsys):
    outcome = anatomy.check_fp16_divide_after(stub, cluster=cluster)
    assert outcome.status == NOT_ATTEMPTED and outcome.value is anatomy.fp16_divide_after
    assert "not attempted yet" in capsys.readouterr().out

    divides_first = anatomy.check_fp16_divide_after(default_hooks.fp16_compress_hook, cluster=cluster)
    assert divides_first.status == WRONG and "divides before the all-reduce" in divides_first.message
    forgot = anatomy.check_fp16_divide_after(anatomy._sum_without_dividing, cluster=cluster)
    assert forgot.status == WRONG and "W times the mean" in forgot.message
    fp32 = anatomy.check_fp16_divide_after(no_cast, cluster=cluster)
    assert fp32.status == WRONG and "float32" in fp32.message and "cast the bucket to float16" in fp32.message
    bf16 = anatomy.check_fp16_divide_after(bf16_wire, cluster=cluster)
    assert bf16.status == WRONG and "8 significand bits" in bf16.message
    twice = anatomy.check_fp16_divide_after(divides_twice, cluster=cluster)
    assert twice.status == WRONG and "divides by W twice" in twice.message
    apart = anatomy.check_fp16_divide_after(only_rank_0_divides, cluster=cluster)
    assert apart.status == WRONG and "different gradients" in apart.message
    broken = anatomy.check_fp16_divide_after(raises_inside, cluster=cluster)
    assert broken.status == WRONG and "boom" in broken.message
    assert outcome.value is divides_first.value is anatomy.fp16_divide_after

    two = anatomy.check_fp16_divide_after(divide_by_two_after, cluster=cluster)
    assert two.status == WRONG and "On 3 ranks" in two.message and "dist.get_world_size()" in two.message

    right = anatomy.check_fp16_divide_after(divide_in_half_after, cluster=cluster)
    assert right.status == RIGHT and right.value is divide_in_half_after
    for message in (divides_first, forgot, fp32, bf16, twice, apart, two):  # hints, never the answer's numbers
        assert "Bit for bit" not in message.message
    assert anatomy.check_fp16_divide_after(anatomy.fp16_divide_after, cluster=cluster).status == RIGHT


def test_the_cases_separate_the_two_orders(cluster):
    """The check can only tell divide-first from divide-after because some case overflows and some underflows."""
    ranks = cluster.run(
        anatomy.run_hooks_on_cases,
        {"after": anatomy.fp16_divide_after, "first": default_hooks.fp16_compress_hook},
        anatomy.CASES,
    )
    after, first = ranks[0]["after"]["grads"], ranks[0]["first"]["grads"]
    assert torch.isinf(after["huge"]).any() and torch.isfinite(first["huge"]).all()
    assert (first["tiny"] == 0).any() and (after["tiny"] > 0).all()
    assert torch.equal(after["ordinary"], first["ordinary"])  # halving is exact in the normal range
    assert ranks[0]["after"]["dtypes"] == ["float16"]


def test_reveal_shows_the_fp16_divide_after_reference(capsys):
    exercises.reveal("fp16_divide_after")
    assert "def fp16_divide_after(state, bucket)" in capsys.readouterr().out

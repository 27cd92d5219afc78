"""Notebook 10's exercise checks: not attempted, wrong (with the hint that fits the mistake), right."""

from types import SimpleNamespace

import pandas as pd
import pytest
import torch.distributed as dist

from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import hooks_in_the_real_world as exercise
from commhooks_lab.hooks.contract import completed_future

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def stub(state, bucket):
    raise NotImplementedError


def bucket_only(state, bucket):
    buffer = bucket.buffer()
    dist.all_reduce(buffer.div_(dist.get_world_size()))
    return completed_future(buffer)


def forgets_to_divide(state, bucket):
    grad = bucket[0] if isinstance(bucket, tuple) else bucket.buffer()
    dist.all_reduce(grad)
    return completed_future(grad)


def mine(state, bucket):
    tensor = bucket[0] if isinstance(bucket, tuple) else bucket.buffer()
    tensor /= dist.get_world_size()
    dist.all_reduce(tensor)
    return completed_future(tensor)


def test_not_attempted_hands_on_the_reference(cluster):
    outcome = exercise.check_compile_safe_hook(stub, cluster=cluster)
    assert outcome.status == NOT_ATTEMPTED and outcome.value is exercise.compile_safe_mean_hook


@pytest.mark.parametrize(
    "attempt, hint",
    [(bucket_only, "take bucket[0] when isinstance(bucket, tuple)"), (forgets_to_divide, "divide the bucket")],
)
def test_wrong_attempts_get_the_hint_for_their_mistake(attempt, hint, cluster):
    outcome = exercise.check_compile_safe_hook(attempt, cluster=cluster)
    assert outcome.status == WRONG and hint in outcome.message
    assert outcome.value is exercise.compile_safe_mean_hook


def test_a_compile_safe_hook_passes(cluster):
    outcome = exercise.check_compile_safe_hook(mine, cluster=cluster)
    assert outcome.status == RIGHT and outcome.value is mine


def fake_run(payload):
    return SimpleNamespace(steps=pd.DataFrame({"payload_bytes": payload}))


def test_the_bytes_prediction_is_judged_on_the_steps_after_the_resume():
    kept, lost = fake_run([9, 9, 1, 1, 1]), fake_run([9, 9, 9, 1, 1])
    assert exercise.check_bytes_prediction(None, kept, lost, 2).status == NOT_ATTEMPTED
    assert exercise.check_bytes_prediction("more", kept, lost, 2).status == RIGHT
    wrong = exercise.check_bytes_prediction("same", kept, lost, 2)
    assert wrong.status == WRONG and "start_powerSGD_iter" in wrong.message
    assert exercise.bytes_answer(kept, kept, 2) == "same"


def returns_the_tensor_always(state, bucket):
    grad = bucket[0] if isinstance(bucket, tuple) else bucket.buffer()
    dist.all_reduce(grad.div_(dist.get_world_size()))
    return grad


def test_a_hook_that_returns_no_future_in_eager_is_told_what_ddp_needs(cluster):
    outcome = exercise.check_compile_safe_hook(returns_the_tensor_always, cluster=cluster)
    assert outcome.status == WRONG and "completed_future(tensor)" in outcome.message

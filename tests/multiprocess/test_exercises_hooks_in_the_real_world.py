"""Notebook 11's exercise checks: not attempted, wrong (with the hint that fits the mistake), right."""

from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from commhooks_lab import _compat
from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import hooks_in_the_real_world as exercise
from commhooks_lab.hooks.contract import completed_future

MODES = ("eager", "compiled_autograd")  # the two the check runs

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


def future_in_both_forms(state, bucket):  # right gradients, but builds a Future under compiled autograd too
    tensor = bucket[0] if isinstance(bucket, tuple) else bucket.buffer()
    tensor /= dist.get_world_size()
    dist.all_reduce(tensor)
    return completed_future(tensor)


def bare_future_in_both_forms(state, bucket):  # the same, with the Future written out
    tensor = bucket[0] if isinstance(bucket, tuple) else bucket.buffer()
    dist.all_reduce(tensor.div_(dist.get_world_size()))
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def mine(state, bucket):
    tensor = bucket[0] if isinstance(bucket, tuple) else bucket.buffer()
    tensor /= dist.get_world_size()
    dist.all_reduce(tensor)
    if isinstance(bucket, tuple):
        return tensor
    return completed_future(tensor)


def test_not_attempted_hands_on_the_reference(cluster):
    outcome = exercise.check_compile_safe_hook(stub, cluster=cluster)
    assert outcome.status == NOT_ATTEMPTED and outcome.value is exercise.compile_safe_mean_hook


@pytest.mark.parametrize(
    "attempt, hint",
    [
        (bucket_only, "take bucket[0] when isinstance(bucket, tuple)"),
        (forgets_to_divide, "divide the bucket"),
        (future_in_both_forms, "return the tensor itself"),
        (bare_future_in_both_forms, "making a torch.futures.Future"),
    ],
)
def test_wrong_attempts_get_the_hint_for_their_mistake(attempt, hint, cluster):
    outcome = exercise.check_compile_safe_hook(attempt, cluster=cluster)
    assert outcome.status == WRONG and hint in outcome.message
    assert outcome.value is exercise.compile_safe_mean_hook


def test_a_compile_safe_hook_passes(cluster):
    outcome = exercise.check_compile_safe_hook(mine, cluster=cluster, world_sizes=(2,))
    assert outcome.status == RIGHT and outcome.value is mine
    reference = exercise.compile_safe_mean_hook
    assert exercise.check_compile_safe_hook(reference, cluster=cluster, world_sizes=(2,)).status == RIGHT


def test_a_future_under_compiled_autograd_is_a_counted_graph_break(cluster):
    """The check's third step rests on the matrix's count: none for the reference, some for a Future. Mode by mode,
    as the check asks: the rows the checks above computed are not computed again (the matrix caches each hook)."""
    import pandas as pd

    from commhooks_lab.studies.compile_matrix import compile_compatibility

    tables = [compile_compatibility([future_in_both_forms, mine], modes=(m,), cluster=cluster) for m in MODES]
    rows = pd.concat(tables).set_index(["hook", "mode"])
    assert rows.loc[("future_in_both_forms", "compiled_autograd"), "graph_breaks"] > 0
    reasons = rows.loc[("future_in_both_forms", "compiled_autograd"), "graph_break"].split(" | ")
    assert any(_compat.is_future_graph_break(why) for why in reasons), reasons  # worded anew in torch 2.14
    assert rows.loc[("mine", "compiled_autograd"), "graph_breaks"] == 0
    assert (rows.xs("eager", level="mode")["graph_breaks"] == 0).all()


def fake_run(payload):
    return SimpleNamespace(steps=pd.DataFrame({"payload_bytes": payload}))


def test_the_bytes_prediction_is_judged_on_the_steps_after_the_resume():
    kept, lost = fake_run([9, 9, 1, 1, 1]), fake_run([9, 9, 9, 1, 1])
    assert exercise.check_bytes_prediction(None, kept, lost, 2).status == NOT_ATTEMPTED
    assert exercise.check_bytes_prediction("more", kept, lost, 2).status == RIGHT
    wrong = exercise.check_bytes_prediction("same", kept, lost, 2)
    assert wrong.status == WRONG and "start_powerSGD_iter" in wrong.message
    assert exercise.bytes_answer(kept, kept, 2) == "same"


@pytest.mark.parametrize(
    "wrong, runs, hint",
    [
        ("same", ([9, 9, 1, 1, 1], [9, 9, 9, 1, 1]), "what does PowerSGD do before start_powerSGD_iter"),
        ("fewer", ([9, 9, 1, 1, 1], [9, 9, 9, 1, 1]), "its own counter"),
        ("more", ([9, 9, 1, 1, 1], [9, 9, 1, 1, 1]), "where state.iter stands"),  # were nothing lost
        ("More", ([9, 9, 1, 1, 1], [9, 9, 9, 1, 1]), "spelt exactly so"),
        ("higher", ([9, 9, 1, 1, 1], [9, 9, 9, 1, 1]), "'higher' is not one of the choices"),
        (1, ([9, 9, 1, 1, 1], [9, 9, 9, 1, 1]), "not the int 1"),
    ],
)
def test_the_bytes_prediction_wrong_answers_get_their_own_message(wrong, runs, hint):
    outcome = exercise.check_bytes_prediction(wrong, fake_run(runs[0]), fake_run(runs[1]), 2)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert "counts from iter 0 again" not in outcome.message


def returns_the_tensor_always(state, bucket):
    grad = bucket[0] if isinstance(bucket, tuple) else bucket.buffer()
    dist.all_reduce(grad.div_(dist.get_world_size()))
    return grad


def test_a_hook_that_returns_no_future_in_eager_is_told_what_ddp_needs(cluster):
    outcome = exercise.check_compile_safe_hook(returns_the_tensor_always, cluster=cluster)
    assert outcome.status == WRONG and "completed_future(tensor)" in outcome.message


def divides_by_two(state, bucket):  # issue 50: the exact mean at 2 ranks, in both forms
    grad = bucket[0] if isinstance(bucket, tuple) else bucket.buffer()
    dist.all_reduce(grad.div_(2), group=state)
    if isinstance(bucket, tuple):
        return grad
    return completed_future(grad)


@pytest.fixture(scope="module")
def ranks(cluster):
    """2 ranks (the module's), 3 and 4: one start each for the file."""
    from commhooks_lab import Cluster

    with Cluster(world_size=3) as three, Cluster(world_size=4) as four:
        yield [cluster, three, four]


def test_at_three_ranks_the_reference_and_a_right_hook_pass_and_no_division_is_caught(ranks):
    """From three ranks on gloo, eager DDP's flat bucket and compiled autograd's single gradients are summed in
    another order: a check that held the compiled gradient to the reference's eager one turned its own reference
    away ("leaves another gradient"). Both forms at 3 ranks (world_sizes=(3,))."""
    three = ranks[1]
    assert exercise.check_compile_safe_hook(exercise.compile_safe_mean_hook, three, world_sizes=(3,)).status == RIGHT
    assert exercise.check_compile_safe_hook(mine, cluster=three, world_sizes=(3,)).status == RIGHT
    wrong = exercise.check_compile_safe_hook(forgets_to_divide, cluster=three, world_sizes=(3,))
    assert wrong.status == WRONG and "divide the bucket" in wrong.message


def test_right_hooks_pass_at_two_three_and_four_ranks_and_a_division_by_two_does_not(ranks):
    """Issue 50: divides_by_two passed the check at 2 ranks. Both forms at 2 ranks, eager DDP at 3 and 4."""
    for right in (exercise.compile_safe_mean_hook, mine):
        outcome = exercise.check_compile_safe_hook(right, cluster=ranks)
        assert outcome.status == RIGHT and "in eager DDP at 3, 4 ranks too" in outcome.message, outcome.message
    wrong = exercise.check_compile_safe_hook(divides_by_two, cluster=ranks)
    assert wrong.status == WRONG and "right at 2 ranks, but at 3:" in wrong.message, wrong.message
    assert "a 2 where the world size belongs" in wrong.message
    assert "divide the bucket by the world size" in wrong.message

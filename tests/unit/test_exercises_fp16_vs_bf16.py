"""Notebook 3's exercise checks on their three paths: not attempted, wrong (plausible mistakes), right."""

import functools
import operator

import pytest
import torch

from commhooks_lab import exercises
from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import fp16_vs_bf16 as precision

ENTRIES = [1e5, 2.0, 1e-3, 3e-5, 2e-7, 1e-8]


def test_survives_matches_the_formats():
    assert precision.survives(ENTRIES, torch.float16) == [False, True, True, True, False, False]
    assert precision.survives(ENTRIES, torch.bfloat16) == [True] * 6


RIGHT_GUESS = {"float16": [False, True, True, True, False, False], "bfloat16": [True] * 6}


def test_cast_prediction_on_its_three_paths(capsys):
    outcome = precision.check_within_one_percent(None, ENTRIES)
    assert outcome.status == NOT_ATTEMPTED and "no prediction made" in capsys.readouterr().out
    # plausible and wrong: every subnormal fails (3e-5 does not: 500 spacings), bf16 loses tiny values
    guess = {"float16": [False, True, True, False, False, False], "bfloat16": [True, True, True, True, False, False]}
    wrong = precision.check_within_one_percent(guess, ENTRIES)
    assert wrong.status == WRONG
    assert (
        "float16 is not right for 3e-05" in wrong.message and "bfloat16 is not right for 2e-07, 1e-08" in wrong.message
    )
    assert "True" not in wrong.message and "False" not in wrong.message  # a hint, not the answer
    assert precision.check_within_one_percent({"float16": [True]}, ENTRIES).status == WRONG
    assert precision.check_within_one_percent(RIGHT_GUESS, ENTRIES).status == RIGHT


def changed(**formats):
    return {**RIGHT_GUESS, **formats}


@pytest.mark.parametrize(
    "wrong, hint",
    [
        ({"float16": [True] * 6, "bfloat16": [True] * 6}, "every entry to survive"),  # "1% is generous"
        ({"float16": RIGHT_GUESS["float16"], "bfloat16": RIGHT_GUESS["float16"]}, "the same answers"),
        ({"float16": RIGHT_GUESS["bfloat16"], "bfloat16": RIGHT_GUESS["float16"]}, "which format has which range"),
        (changed(float16=[False, True, True, False, False, False]), "below float16's smallest normal"),
        (changed(bfloat16=[True, True, True, True, False, False]), "in bfloat16's normal range"),
        (changed(float16=[True, True, True, True, False, False]), "above float16's largest finite value"),
        (changed(float16=[False, True, True, True, True, False]), "below float16's smallest normal"),
        ({"fp16": RIGHT_GUESS["float16"], "bf16": RIGHT_GUESS["bfloat16"]}, 'keys "float16" and "bfloat16"'),
        (changed(float16=[False, True, True]), "give 6 answers"),
        (changed(float16=["no", "yes", "yes", "yes", "no", "no"]), "True or False for each entry, not 'no'"),
        (changed(bfloat16=True), "give a list of 6 answers"),
    ],
)
def test_cast_prediction_wrong_answers_get_their_own_hint(wrong, hint):
    outcome = precision.check_within_one_percent(wrong, ENTRIES)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert "True" not in outcome.message.replace("True or False", "") and "False" not in outcome.message.replace(
        "True or False", ""
    )


def stub(local_grads, dtype):
    raise NotImplementedError


def cast_once(local_grads, dtype):  # plausible and wrong: average exactly, round once
    return (sum(local_grads) / len(local_grads)).to(dtype).float()


def divide_after(local_grads, dtype):  # wrong order: sum in dtype, divide in float32
    return sum(g.to(dtype) for g in local_grads).float() / len(local_grads)


def no_divide(local_grads, dtype):
    return sum(g.to(dtype) for g in local_grads).float()


def sum_in_float32(local_grads, dtype):  # rounds each rank's part but not the sum
    return sum((g.to(dtype) / len(local_grads)).float() for g in local_grads)


def always_half(local_grads, dtype):  # ignores the dtype argument
    return sum(g.half() / len(local_grads) for g in local_grads).float()


def returns_half(local_grads, dtype):
    return sum(g.to(dtype) / len(local_grads) for g in local_grads)


def divide_then_cast(local_grads, dtype):  # plausible and wrong: divides in float32 before the cast
    return functools.reduce(operator.add, [(g / len(local_grads)).to(dtype) for g in local_grads]).float()


def by_two(local_grads, dtype):  # plausible and wrong: right for the notebook's two ranks only
    return functools.reduce(operator.add, [g.to(dtype) / 2 for g in local_grads]).float()


def reversed_ranks(local_grads, dtype):  # plausible and wrong: adds the last rank first
    total = None
    for g in reversed(local_grads):
        total = g.to(dtype) / len(local_grads) if total is None else total + g.to(dtype) / len(local_grads)
    return total.float()


def stacked(local_grads, dtype):  # plausible and wrong on three ranks: torch.sum accumulates in float32
    return torch.stack([g.to(dtype) / len(local_grads) for g in local_grads]).sum(0).to(torch.float32)


def folded(local_grads, dtype):  # right, written differently
    return functools.reduce(operator.add, [g.to(dtype) / len(local_grads) for g in local_grads]).to(torch.float32)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (cast_once, "rounded once"),
        (divide_after, "divided by W after the sum"),
        (no_divide, "W times the mean"),
        (sum_in_float32, "summed in float32"),
        (always_half, "use the dtype argument"),
        (returns_half, "casts the sum back to float32"),
        (lambda grads, dtype: simulate_then_nudge(grads, dtype), "differs from the hook's"),
        (divide_then_cast, "divided before casting"),
        (by_two, "divided by 2"),
        (reversed_ranks, "reverse order"),
        (stacked, "one by one"),
        (lambda grads, dtype: torch.zeros(256), "differs from the hook's"),  # a hard-coded tensor
        (lambda grads, dtype: torch.zeros(3), "the gradient's shape"),
    ],
)
def test_simulate_check_names_each_mistake(wrong, hint):
    outcome = precision.check_simulate_compress(wrong)
    assert outcome.status == WRONG and hint in outcome.message and outcome.value is precision.simulate_compress


def simulate_then_nudge(grads, dtype):
    out = precision.simulate_compress(grads, dtype)
    out[0] = out[0] * 1.5 + 1.0
    return out


def test_simulate_check_on_the_other_two_paths(capsys):
    outcome = precision.check_simulate_compress(stub)
    assert outcome.status == NOT_ATTEMPTED and outcome.value is precision.simulate_compress
    assert "not attempted yet" in capsys.readouterr().out
    outcome = precision.check_simulate_compress(folded)
    assert outcome.status == RIGHT and outcome.value is folded


def test_the_reference_rounds_each_rank_then_the_sum():
    g = [torch.tensor([1.0 + 2.0**-11]), torch.tensor([1.0 + 2.0**-11])]  # halfway between two float16 values
    assert precision.simulate_compress(g, torch.float16).item() == 1.0  # ties to even, on each rank
    tiny = [torch.tensor([2.0**-24]), torch.tensor([2.0**-24])]
    assert precision.simulate_compress(tiny, torch.float16).item() == 0.0  # the halves underflow
    exercises.reveal("simulate_compress")

"""Notebook 1's exercise checks on their three paths: not attempted, wrong (plausible wrong formulas), right."""

import math

import pandas as pd
import pytest
import torch

from commhooks_lab import exercises
from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG, quickstart
from commhooks_lab.result import Result, ResultSet


def fake_results(rel_errors: dict[str, float]) -> ResultSet:
    """Results whose summaries have the given mean rel_error (every step compressed)."""
    out = ResultSet()
    for name, value in rel_errors.items():
        steps = pd.DataFrame(
            {
                "step": [0, 1],
                "rel_error": [value, value],
                "cosine": [1.0, 1.0],
                "rank_spread": [0.0, 0.0],
                "compressing": [True, True],
                "payload_bytes": [2, 2],
                "uncompressed_bytes": [4, 4],
            }
        )
        out.append(Result(config={"name": name}, steps=steps, layers=pd.DataFrame(), final={}))
    return out


RESULTS = fake_results({"fp16": 3.0e-4, "bf16": 2.3e-3, "power_sgd r1": 1.4})


def test_bf16_over_fp16_prediction_on_its_three_paths(capsys):
    assert quickstart.check_bf16_over_fp16(None, RESULTS).status == NOT_ATTEMPTED
    assert "no prediction made" in capsys.readouterr().out
    wrong = quickstart.check_bf16_over_fp16(2, RESULTS)
    assert wrong.status == WRONG and "unit roundoff" in wrong.message and "8" not in wrong.message
    assert quickstart.check_bf16_over_fp16(8, RESULTS).status == RIGHT
    assert quickstart.check_bf16_over_fp16(8.0, RESULTS).status == RIGHT


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (0.125, "more precise format"),  # the ratio the other way round
        (1, "split their 16 bits differently"),  # "same bytes, same error"
        (3, "That counts bits"),  # the difference in significand bits
        (16, "the same measure"),  # machine epsilon of one format, unit roundoff of the other
        (4, "the same measure"),
        (256, "Both hooks round every value"),  # any other power of two: the general hint
        (7.7, "is not a power of two"),  # the measured ratio, not rounded
        ("8", "give a number"),
        (True, "give a number"),
        (-8, "is not a power of two"),
    ],
)
def test_bf16_over_fp16_wrong_answers_get_their_own_hint(wrong, hint):
    outcome = quickstart.check_bf16_over_fp16(wrong, RESULTS)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert "= 8" not in outcome.message and "2^-8 / 2^-11" not in outcome.message  # the hint never answers


def test_the_ratio_answer_comes_from_the_run_not_from_a_constant():
    other = fake_results({"fp16": 1e-4, "bf16": 4.1e-4, "power_sgd r1": 0.5})
    assert quickstart.check_bf16_over_fp16(4, other).status == RIGHT
    assert quickstart.check_bf16_over_fp16(8, other).status == WRONG


def test_powersgd_prediction_on_its_three_paths():
    assert quickstart.check_powersgd_above_one(None, RESULTS).status == NOT_ATTEMPTED
    wrong = quickstart.check_powersgd_above_one(False, RESULTS)
    assert wrong.status == WRONG and "error feedback" in wrong.message and "1.40" not in wrong.message
    right = quickstart.check_powersgd_above_one(True, RESULTS)
    assert right.status == RIGHT and "1.40" in right.message
    below = fake_results({"fp16": 1e-4, "bf16": 8e-4, "power_sgd r1": 0.7})
    assert quickstart.check_powersgd_above_one(False, below).status == RIGHT


@pytest.mark.parametrize(
    "wrong, results, hint",
    [
        (False, RESULTS, "g_t + e_(t-1), not of g_t"),  # the one wrong choice when the run is above 1
        (True, fake_results({"fp16": 1e-4, "bf16": 8e-4, "power_sgd r1": 0.7}), "how large was the leftover"),
        ("yes", RESULTS, "answer True or False"),
        ("True", RESULTS, "not the str 'True'"),
        (1, RESULTS, "not the int 1"),  # 1 == True in Python: still not an answer
        (1.4, RESULTS, "not the float 1.4"),
    ],
)
def test_powersgd_wrong_and_malformed_answers_get_their_own_message(wrong, results, hint):
    outcome = quickstart.check_powersgd_above_one(wrong, results)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert "Mean per-step rel_error" not in outcome.message


def stub(h, exact):
    """||h - exact|| / ||exact||."""
    raise NotImplementedError


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda h, e: ((h - e).norm() / h.norm()).item(), "norm of h"),
        (lambda h, e: (((h - e) ** 2).sum() / (e**2).sum()).item(), "square of rel_error"),
        (lambda h, e: ((h - e).abs() / e.abs()).mean().item(), "element-wise"),
        (lambda h, e: ((h - e).abs().max() / e.abs().max()).item(), "max-norm"),
        (lambda h, e: ((h - e).abs().sum() / e.abs().sum()).item(), "1-norm"),
        (lambda h, e: (h - e).norm().item(), "did not divide"),
        (lambda h, e: ((h - e).norm() / e.norm()).item() * 1.01, "not ||h - exact|| / ||exact||"),
        (lambda h, e: ((h.norm() - e.norm()).abs() / e.norm()).item(), "difference of the two norms"),
        # right on vectors only: ord=2 of a matrix is its largest singular value
        (lambda h, e: (torch.linalg.norm(h - e, 2) / torch.linalg.norm(e, 2)).item(), "matrix 2-norm"),
        (lambda h, e: ((h.float() - e.float()).norm() / e.float().norm()).item(), "compute in float64"),
        (lambda h, e: 1.0, "on every test pair"),  # a hard-coded number (right for h = 0 only)
        (lambda h, e: 0.0123, "on every test pair"),
    ],
)
def test_rel_error_check_names_each_plausible_wrong_formula(wrong, hint):
    outcome = quickstart.check_rel_error(wrong)
    assert outcome.status == WRONG and hint in outcome.message and outcome.value is quickstart.rel_error


def test_rel_error_check_on_the_other_two_paths(capsys):
    outcome = quickstart.check_rel_error(stub)
    assert outcome.status == NOT_ATTEMPTED and outcome.value is quickstart.rel_error
    assert "not attempted yet" in capsys.readouterr().out

    def mine(h, exact):  # right, written differently: float32 inputs are fine too
        return math.sqrt(float(((h - exact) ** 2).sum())) / math.sqrt(float((exact**2).sum()))

    outcome = quickstart.check_rel_error(mine)
    assert outcome.status == RIGHT and outcome.value is mine


def test_the_reference_is_the_lab_definition():
    h, exact = torch.tensor([1.0, 2.0, 2.0]), torch.tensor([1.0, 2.0, 0.0])
    assert quickstart.rel_error(h, exact) == pytest.approx(2.0 / math.sqrt(5.0))
    assert quickstart.rel_error(torch.zeros(3), exact) == 1.0
    exercises.reveal("rel_error")

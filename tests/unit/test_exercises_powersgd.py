"""Notebook 4's checks on their three paths: not attempted, wrong (plausible wrong algorithms), right."""

import pandas as pd
import pytest
import torch

from commhooks_lab import exercises
from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import powersgd as ex
from commhooks_lab.result import Result


def stub(matrix, r):
    """Your code here."""
    raise NotImplementedError


def truncated_svd(matrix, r):  # right, by a different route: build M_r and measure it
    u, s, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    approx = u[:, :r] @ torch.diag(s[:r]) @ vh[:r]
    return ((matrix.double() - approx).norm() / matrix.double().norm()).item()


def spectral(matrix, r):  # plausible and wrong: sigma_{r+1} / sigma_1
    s = torch.linalg.svdvals(matrix.double())
    return (s[r] / s[0]).item() if r < len(s) else 0.0


def not_squared(matrix, r):
    s = torch.linalg.svdvals(matrix.double())
    return (s[r:].sum() / s.sum()).item()


def energy_lost(matrix, r):
    s = torch.linalg.svdvals(matrix.double())
    return (s[r:].square().sum() / s.square().sum()).item()


def off_by_one(matrix, r):
    s = torch.linalg.svdvals(matrix.double())
    return (s[r - 1 :].square().sum().sqrt() / s.norm()).item()


def absolute(matrix, r):
    return torch.linalg.svdvals(matrix.double())[r:].norm().item()


def random_projection(matrix, r):  # plausible and wrong: one power-iteration step is not the best approximation
    q = torch.randn(matrix.shape[1], r, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p, _ = torch.linalg.qr(matrix.double() @ q)
    return ((matrix.double() - p @ p.T @ matrix.double()).norm() / matrix.double().norm()).item()


def kept_instead(matrix, r):  # what M_r keeps, not what it leaves out
    s = torch.linalg.svdvals(matrix.double())
    return (s[:r].norm() / s.norm()).item()


def in_float32(matrix, r):  # the right formula, in float32
    s = torch.linalg.svdvals(matrix.float())
    return (s[r:].norm() / s.norm()).item()


def test_best_rank_r_error_not_attempted(capsys):
    outcome = ex.check_best_rank_r_error(stub)
    assert outcome.status == NOT_ATTEMPTED and outcome.value is ex.best_rank_r_error
    assert "not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, says",
    [
        (spectral, "spectral norm"),
        (not_squared, "in squares"),
        (energy_lost, "share of energy"),
        (off_by_one, "which ones you dropped"),
        (absolute, "divides it by"),
        (random_projection, "torch.linalg.svd"),
        (kept_instead, "what the approximation keeps"),
        (in_float32, "right up to rounding"),
        (lambda matrix, r: 0.5, "torch.linalg.svd"),  # a hard-coded number
        (lambda matrix, r: [0.5], "one number"),
    ],
)
def test_best_rank_r_error_names_the_mistake(wrong, says):
    outcome = ex.check_best_rank_r_error(wrong)
    assert outcome.status == WRONG and says in outcome.message and outcome.value is ex.best_rank_r_error


def test_best_rank_r_error_wrong_answers_print_no_expected_value():
    message = ex.check_best_rank_r_error(spectral).message
    expected = [f"{ex.best_rank_r_error(m, r):.3g}" for m, r in ex._cases()]
    assert not any(value in message for value in expected)


def test_best_rank_r_error_wants_a_number():
    outcome = ex.check_best_rank_r_error(lambda m, r: [0.5])
    assert outcome.status == WRONG and "one number" in outcome.message


def test_best_rank_r_error_right():
    outcome = ex.check_best_rank_r_error(truncated_svd)
    assert outcome.status == RIGHT and outcome.value is truncated_svd
    assert ex.check_best_rank_r_error(ex.best_rank_r_error).status == RIGHT


def test_best_rank_r_error_is_eckart_young():
    m = torch.diag(torch.tensor([3.0, 4.0, 0.0]))
    assert ex.best_rank_r_error(m, 1) == pytest.approx(3 / 5)
    assert ex.best_rank_r_error(m, 2) == 0.0


def fake_sweep(errors: dict) -> list:
    return [
        Result(
            {"state_options": {"matrix_approximation_rank": r}}, pd.DataFrame({"rel_error": [0.9, e]}), pd.DataFrame()
        )
        for r, e in errors.items()
    ]


def test_smallest_matrix_rank_on_its_three_paths():
    sweep = fake_sweep({1: 1.5, 2: 1.0, 4: 4e-7, 8: 4e-7})
    assert ex.smallest_exact_matrix_rank(sweep) == 4
    assert ex.check_smallest_matrix_rank(None, sweep).status == NOT_ATTEMPTED
    wrong = ex.check_smallest_matrix_rank(8, sweep)
    assert wrong.status == WRONG and "singular values" in wrong.message and "4" not in wrong.message
    off = ex.check_smallest_matrix_rank(3, sweep)
    assert off.status == WRONG and "[1, 2, 4, 8]" in off.message
    right = ex.check_smallest_matrix_rank(4, sweep)
    assert right.status == RIGHT and right.value == 4


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (1, "cannot span its column space"),  # "PowerSGD of matrix rank 1 is enough"
        (2, "cannot span its column space"),
        (8, "is it the smallest"),  # "more is safer"
        (3, "Predict one of the matrix ranks the sweep ran, [1, 2, 4, 8]"),  # not swept
        (0, "Predict one of the matrix ranks the sweep ran"),
        ("4", "a whole number"),
        (True, "a whole number"),  # True == 1 in Python, and still not an answer
        (4.5, "a whole number"),
    ],
)
def test_smallest_matrix_rank_wrong_answers_get_their_own_hint(wrong, hint):
    sweep = fake_sweep({1: 1.5, 2: 1.0, 4: 4e-7, 8: 4e-7})
    outcome = ex.check_smallest_matrix_rank(wrong, sweep)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert "exactly that many" not in outcome.message


def test_reveal_shows_the_best_rank_r_error_reference(capsys):
    exercises.reveal("best_rank_r_error")
    assert "svdvals" in capsys.readouterr().out

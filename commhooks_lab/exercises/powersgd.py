"""Notebook 4's exercises: predict the matrix rank PowerSGD needs; the best matrix-rank-r error (Eckart–Young).

The code check compares the learner's function with the reference on fixed matrices whose spectra
are known, and names the plausible mistakes it can tell apart (spectral instead of Frobenius norm,
singular values not squared, energy share without the square root, the wrong singular values
dropped, an absolute instead of a relative error) without printing a single expected value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .checking import Outcome, check_function, check_prediction, reference, whole_number_problem

__all__ = ["best_rank_r_error", "check_best_rank_r_error", "check_smallest_matrix_rank", "smallest_exact_matrix_rank"]

#: The error below which PowerSGD counts as having reproduced the gradient exactly (float32 rounding is ~1e-7).
EXACT_BELOW = 1e-4

# -- references -------------------------------------------------------------------------------------


@reference("best_rank_r_error")
def best_rank_r_error(matrix: torch.Tensor, r: int) -> float:
    """||M - M_r||_F / ||M||_F for the best matrix-rank-r approximation M_r (truncated SVD, Eckart–Young)."""
    sv = torch.linalg.svdvals(matrix.double())
    return (sv[r:].square().sum().sqrt() / sv.square().sum().sqrt()).item()


# -- the fixed inputs the check uses, and the mistakes it can name ---------------------------------


def _matrix_with_spectrum(spectrum: Sequence[float], n: int, m: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(n, len(spectrum), generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(m, len(spectrum), generator=gen, dtype=torch.float64))
    return u @ torch.diag(torch.tensor(spectrum, dtype=torch.float64)) @ v.T


def _cases() -> list[tuple[torch.Tensor, int]]:
    gaussian = torch.randn(40, 30, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    decaying = _matrix_with_spectrum([5.0, 3.0, 2.0, 1.0, 0.5, 0.25], 20, 12, seed=1)
    scaled = 1e-3 * _matrix_with_spectrum([4.0, 2.0, 2.0, 1.0], 16, 8, seed=2)
    return [(gaussian, 1), (gaussian, 5), (decaying, 1), (decaying, 2), (decaying, 3), (scaled, 1), (decaying, 6)]


def _mistakes() -> list[tuple[Callable[[torch.Tensor, int], float], str]]:
    def svals(m: torch.Tensor) -> torch.Tensor:
        return torch.linalg.svdvals(m.double())

    def spectral(m, r):
        s = svals(m)
        return (s[r] / s[0]).item() if r < len(s) else 0.0

    def not_squared(m, r):
        s = svals(m)
        return (s[r:].sum() / s.sum()).item()

    def energy_lost(m, r):
        s = svals(m)
        return (s[r:].square().sum() / s.square().sum()).item()

    def kept_instead(m, r):
        s = svals(m)
        return (s[:r].square().sum().sqrt() / s.square().sum().sqrt()).item()

    def off_by_one(m, r):
        s = svals(m)
        return (s[max(r - 1, 0) :].square().sum().sqrt() / s.square().sum().sqrt()).item()

    def absolute(m, r):
        return svals(m)[r:].square().sum().sqrt().item()

    return [
        (
            spectral,
            "you measured in the spectral norm (the largest singular value); rel_error is a Frobenius-norm "
            "ratio, to which every singular value you drop contributes.",
        ),
        (
            not_squared,
            "Frobenius norms add singular values in squares (||M||_F^2 = sum of sigma_i^2): look at how "
            "you combine the ones you drop.",
        ),
        (energy_lost, "you returned a share of energy, a ratio of squared norms; rel_error is a ratio of norms."),
        (kept_instead, "you measured what the approximation keeps; rel_error measures what it leaves out."),
        (
            off_by_one,
            "an approximation of matrix rank r keeps r singular values: check which ones you dropped "
            "(Python counts from 0).",
        ),
        (absolute, "that is the absolute error ||M - M_r||_F; rel_error divides it by ||M||_F."),
    ]


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(b), 1e-12) + 1e-12


def _verify_best_rank_r_error(fn) -> str | None:
    cases = _cases()
    got = []
    for matrix, r in cases:
        value = fn(matrix.clone(), r)
        try:
            got.append(float(value))
        except (TypeError, ValueError):
            return f"return one number (a float), not {type(value).__name__}."
    if all(_close(g, best_rank_r_error(m, r)) for g, (m, r) in zip(got, cases)):
        return None
    for mistake, hint in _mistakes():
        if all(_close(g, mistake(m, r)) for g, (m, r) in zip(got, cases)):
            return hint
    if all(
        abs(g - best_rank_r_error(m, r)) <= 1e-4 * abs(best_rank_r_error(m, r)) + 1e-6 for g, (m, r) in zip(got, cases)
    ):
        return "right up to rounding: compute in float64 (matrix.double()); float32 rounds the singular values."
    return (
        "your numbers differ from the truncated-SVD error on test matrices: build M_r from torch.linalg.svd on a "
        "small matrix, compute ||M - M_r||_F / ||M||_F directly, and compare with your formula."
    )


def check_best_rank_r_error(attempt) -> Outcome:
    """``best_rank_r_error(matrix, r) -> float``: relative Frobenius error of the truncated SVD.

    Wrong answers it recognises, each told by its own hint: the spectral norm ("spectral norm"); singular values
    not squared ("in squares"); the energy share, without the square root ("share of energy"); what the
    approximation keeps ("what the approximation keeps"); one singular value too few dropped ("which ones you
    dropped"); the absolute error ("divides it by"); float32 arithmetic ("right up to rounding"); something that is
    not a number ("one number"). Anything else gets the general hint ("torch.linalg.svd"): one power-iteration
    step, say, or a hard-coded number (the cases include r = full matrix rank, where the error is 0, and matrices
    of very different scales).
    """
    return check_function(
        "best_rank_r_error",
        attempt,
        _verify_best_rank_r_error,
        "It matches the truncated-SVD error on every test matrix (Eckart–Young: no matrix of matrix rank r "
        "does better).",
    )


# -- prediction -------------------------------------------------------------------------------------


def smallest_exact_matrix_rank(results: Sequence[Any], below: float = EXACT_BELOW) -> int | None:
    """The smallest matrix rank whose run ends with rel_error < ``below`` (None if none does)."""
    reached = [
        r.config["state_options"]["matrix_approximation_rank"] for r in results if r.steps["rel_error"].iloc[-1] < below
    ]
    return min(reached) if reached else None


def check_smallest_matrix_rank(prediction: Any, results: Sequence[Any]) -> Outcome:
    """Was the predicted smallest matrix rank for an exact sketch of the lowrank task right?

    Wrong answers it recognises, each told by its own hint (none says the answer):

    - a swept matrix rank below the answer: "cannot span";
    - a swept matrix rank above the answer: "is it the smallest";
    - a matrix rank the sweep did not run (0, 3, 16): "predict one of the matrix ranks the sweep ran".

    Malformed answers get a clear message instead: not a whole number (a str, a bool, a fraction).
    """
    swept = sorted(r.config["state_options"]["matrix_approximation_rank"] for r in results)
    answer = smallest_exact_matrix_rank(results)
    problem = whole_number_problem(prediction, "a matrix rank") if prediction is not None else None
    if problem is None and prediction is not None and prediction not in swept:
        problem = f"not yet. Predict one of the matrix ranks the sweep ran, {swept}."
    count = (
        "count the lowrank task's singular values that stand far above float32 rounding (about 1e-7 of the "
        "largest). One power-iteration step with a random Q of matrix rank r reproduces a matrix whose matrix "
        "rank is at most r exactly; below that it cannot."
    )
    slips = []
    if answer is not None:
        slips = [
            (r, f"at a matrix rank below the gradient's, P = MQ cannot span its column space: {count}")
            for r in swept
            if r < answer
        ] + [
            (r, f"that matrix rank reproduces the gradient too, but is it the smallest? {count}")
            for r in swept
            if r > answer
        ]
    return check_prediction(
        "smallest_matrix_rank",
        prediction,
        answer,
        count,
        "The gradient has exactly that many non-zero singular values: P = MQ spans its column space, and P P^T M = M.",
        slips=slips,
        malformed=lambda attempt: problem,
    )

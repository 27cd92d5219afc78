"""Notebook 1's exercises: two predictions about the comparison, and ``rel_error`` written by hand.

The prediction checks compute their answers from the learner's own run (never a hard-coded
number), so they stay right if the run changes. The ``rel_error`` check compares the learner's
function with the reference on fixed inputs, and recognises the usual wrong formulas by value.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch

from .checking import Outcome, bool_problem, check_function, check_prediction, reference

__all__ = ["check_bf16_over_fp16", "check_powersgd_above_one", "check_rel_error", "rel_error"]

# -- predictions ------------------------------------------------------------------------------------


def check_bf16_over_fp16(prediction: Any, results) -> Outcome:
    """bf16's mean ``rel_error`` over fp16's, to the nearest power of two (answer read from ``results``).

    Wrong answers it recognises, each told by its own hint (none says the answer):

    - the ratio the other way round, fp16's over bf16's (a power of two below 1): "more precise format";
    - 1, "same bytes, same error": "split their 16 bits differently";
    - the difference in significand bits (log2 of the answer, 3 for 8): "That counts bits";
    - twice or half the answer (machine epsilon for one format, unit roundoff for the other): "the same measure";
    - any other power of two: the general hint, "unit roundoff".

    Malformed answers get a clear message instead: not a number (a str, a bool), or a number that is not a
    power of two (the measured ratio itself, say).
    """
    ratio = _summary(results, "bf16")["rel_error"] / _summary(results, "fp16")["rel_error"]
    answer = 2 ** round(math.log2(ratio))
    bits = math.log2(answer)

    def malformed(attempt: Any) -> str | None:
        if isinstance(attempt, bool) or not isinstance(attempt, numbers.Real):
            return f"give a number (1, 2, 4, 8, ...), not the {type(attempt).__name__} {attempt!r}."
        if attempt == bits and bits >= 1:
            return None  # a count of bits: a slip with a hint of its own
        if attempt <= 0 or not math.log2(attempt).is_integer():
            return f"{attempt!r} is not a power of two: the question asks for the ratio rounded to the nearest one."
        return None

    own = (
        "compare the two formats' unit roundoff (GLOSSARY.md#unit-roundoff), which sets the size of one rounding error."
    )
    slips = [
        (1 / answer, f"Below 1 would make bf16 the more precise format: which keeps more significand bits? {own}"),
        (1, f"Both send 2 bytes per number, but they split their 16 bits differently: {own}"),
        (bits, f"That counts bits; the question asks how many times larger one rounding error is. {own}"),
        (2 * answer, f"Use the same measure for both formats, u = 2^-p with p counting the implicit bit. {own}"),
        (answer / 2, f"Use the same measure for both formats, u = 2^-p with p counting the implicit bit. {own}"),
    ]
    return check_prediction(
        "bf16_over_fp16",
        prediction,
        answer,
        "Both hooks round every value they send to a 16-bit format and nothing else differs: compare the two "
        "formats' unit roundoff (GLOSSARY.md#unit-roundoff), which sets the size of one rounding error.",
        f"Measured {ratio:.1f}: the ratio of the unit roundoffs, 2^-8 / 2^-11 = 8. Same bytes, same arithmetic, "
        "so the error scales with the format's precision.",
        slips=[(v, h) for v, h in slips if v != answer],
        malformed=malformed,
    )


def check_powersgd_above_one(prediction: Any, results, name: str = "power_sgd r1") -> Outcome:
    """Is PowerSGD r1's mean per-step ``rel_error`` above 1, the error of sending nothing (h = 0)?

    A prediction with two choices has one wrong one; each gets its own hint (none says the answer):

    - False where the run is above 1 ("error feedback makes every step better"): "g_t + e_(t-1), not of g_t";
    - True where the run is below 1: "how large was the leftover".

    Malformed answers get a clear message instead: anything but a bool ("yes", "True", 1, 1.4).
    """
    value = _summary(results, name)["rel_error"]
    above = bool(value > 1)
    hint = (
        "PowerSGD here runs with error feedback (GLOSSARY.md#error-feedback): at step t it sends a compressed "
        "version of g_t + e_(t-1), not of g_t. How far from this step's exact mean can that be?"
        if above
        else "Error feedback adds last step's leftover e_(t-1) to what PowerSGD compresses: in this run, how large "
        "was the leftover next to the gradient itself, and what does compressing their sum leave?"
    )
    return check_prediction(
        "powersgd_above_one",
        prediction,
        above,
        hint,
        f"Mean per-step rel_error {value:.2f}: each step also carries last step's leftovers, so h_t is far from "
        "this step's mean. What error feedback keeps small is the error of the sum over steps (below).",
        malformed=bool_problem,
    )


def _summary(results, name: str) -> dict:
    return results.by_name(name).summary()


# -- rel_error by hand -------------------------------------------------------------------------------


@reference("rel_error")
def rel_error(h: torch.Tensor, exact: torch.Tensor) -> float:
    """||h - exact|| / ||exact|| in the 2-norm over all elements, in float64."""
    h, exact = torch.as_tensor(h, dtype=torch.float64), torch.as_tensor(exact, dtype=torch.float64)
    return ((h - exact).norm() / exact.norm()).item()


def _test_pairs() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed inputs on which the usual wrong formulas all give a different number from the right one."""
    gen = torch.Generator().manual_seed(13)
    exact = torch.randn(64, generator=gen, dtype=torch.float64)
    exact[::8] = 0.0  # zeros, as in a real gradient (blank pixels, inactive units)
    noisy = 1.3 * exact + 0.2 * torch.randn(64, generator=gen, dtype=torch.float64)
    spiky = exact.clone()
    spiky[5] += 3.0
    # a matrix: the 2-norm over all elements is the Frobenius norm, not the matrix 2-norm (the spectral norm)
    matrix = torch.randn(8, 6, generator=gen, dtype=torch.float64)
    off = matrix + 0.3 * torch.randn(8, 6, generator=gen, dtype=torch.float64)
    return [(noisy, exact), (spiky, exact), (torch.zeros_like(exact), exact), (off, matrix)]


_WRONG_FORMULAS: list[tuple[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = [
    (
        "You divided by the norm of h; rel_error divides by the norm of the exact gradient, the one thing that is "
        "known to be right (h may be far off).",
        lambda h, e: (h - e).norm() / h.norm(),
    ),
    (
        "Your value is the square of rel_error: a norm is the square root of the sum of squares.",
        lambda h, e: ((h - e) ** 2).sum() / (e**2).sum(),
    ),
    (
        "You averaged element-wise relative errors; rel_error is one ratio of two norms (element-wise ratios "
        "blow up where the exact gradient is 0).",
        lambda h, e: ((h - e).abs() / e.abs()).mean(),
    ),
    (
        "You took the largest element-wise difference (the max-norm); rel_error uses the 2-norm of the whole "
        "difference.",
        lambda h, e: (h - e).abs().max() / e.abs().max(),
    ),
    (
        "You used absolute values summed (the 1-norm); rel_error uses the 2-norm: sqrt of the sum of squares.",
        lambda h, e: (h - e).abs().sum() / e.abs().sum(),
    ),
    (
        "You did not divide: rel_error is relative to the size of the exact gradient, ||h - exact|| / ||exact||.",
        lambda h, e: (h - e).norm(),
    ),
    (
        "You took the difference of the two norms, | ||h|| - ||exact|| |; rel_error is the norm of the difference: "
        "h can be as long as exact and point elsewhere.",
        lambda h, e: (h.norm() - e.norm()).abs() / e.norm(),
    ),
    (
        "On a matrix your function measured the matrix 2-norm (the largest singular value: torch.linalg.norm with "
        "ord=2 on a 2-D tensor); rel_error takes the 2-norm over all elements, as if the tensor were flattened.",
        lambda h, e: torch.linalg.matrix_norm(h - e, 2) / torch.linalg.matrix_norm(e, 2),
    ),
]


def _same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300)


def _verify_rel_error(fn) -> str | None:
    values = {float(fn(h.clone(), exact.clone())) for h, exact in _test_pairs()}
    if len(values) == 1:
        return (
            f"Your function returns {values.pop():.6g} on every test pair, whatever h and exact are: compute the "
            "number from the two tensors."
        )
    for h, exact in _test_pairs():
        got = float(fn(h.clone(), exact.clone()))
        if _same(got, rel_error(h, exact)):
            continue
        for hint, formula in _WRONG_FORMULAS:
            try:
                slip = float(formula(h, exact))
            except RuntimeError:  # a matrix norm of a vector
                continue
            if _same(got, slip):
                return hint
        if math.isclose(got, rel_error(h, exact), rel_tol=1e-4):
            return (
                f"Right formula, but {got:.9g} is not {rel_error(h, exact):.9g}: rounding changed it, "
                "so compute in float64 (h.double(), exact.double()) before you subtract."
            )
        return (
            f"On a fixed test pair your function returns {got:.6g}, which is not ||h - exact|| / ||exact||: "
            "subtract first, take the 2-norm of the difference, divide by the 2-norm of exact."
        )
    return None


def check_rel_error(attempt) -> Outcome:
    """``rel_error(h, exact) -> float`` on fixed inputs (three vectors, one with h = 0, and a matrix), against the
    reference.

    Wrong answers it recognises, each told by its own hint: divided by ||h|| ("norm of h"); squared norms ("square
    of rel_error"); the mean of element-wise relative errors ("element-wise"); the max-norm ("max-norm"); the 1-norm
    ("1-norm"); no division ("did not divide"); the difference of the norms ("difference of the two norms"); the
    matrix 2-norm, right on vectors only ("matrix 2-norm"); the right formula rounded in float32 ("compute in
    float64"); a hard-coded number ("on every test pair"). Anything else gets the general hint ("not ||h - exact|| /
    ||exact||").
    """
    return check_function(
        "rel_error",
        attempt,
        _verify_rel_error,
        "The same number as the lab's definition on every test pair, including h = 0 (rel_error 1: sending nothing).",
    )

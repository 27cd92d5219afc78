"""Notebook 6's exercises, done with the dashboard: what warm start does to the summed error, and where
PowerSGD's byte savings end."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

from .checking import NOT_ATTEMPTED, RIGHT, WRONG, Outcome, check_prediction, choice_problem, reference, say

__all__ = ["check_warm_start_prediction", "check_half_bytes_rank", "half_bytes_rank", "uncompressed_from"]

#: fp16's share of fp32's bytes: the line PowerSGD has to stay under to save more than fp16 does.
FP16_SHARE = 0.5
MIN_COMPRESSION_RATE = 2.0  # PowerSGDState's default, which the dashboard shows


# -- exercise 1: warm start off, error feedback on -----------------------------------------------------------


def check_warm_start_prediction(prediction: Any, both_on, without_warm_start) -> Outcome:
    """Prediction "higher" or "lower": cumulative_rel_error without warm start, against both switches on.

    A prediction with two choices has one wrong one; whichever way the measurement goes, the wrong choice gets its
    own hint, and neither hint says the answer:

    - where the measurement went one way: "from fresh random numbers";
    - where it went the other: "in this run".

    Malformed answers get a clear message instead: not a str, or a misspelt choice ("up", "Higher").
    """
    mine = float(without_warm_start.steps["cumulative_rel_error"].iloc[-1])
    kept = float(both_on.steps["cumulative_rel_error"].iloc[-1])
    worse = mine > kept
    hint = (
        "cumulative_rel_error compares the sums over steps. Each step's single power iteration now starts from "
        "fresh random numbers instead of last step's Q: what does that do to what each step misses, and what does "
        "error feedback do with it?"
        if worse
        else "cumulative_rel_error compares the sums over steps: in this run, how much did each step leave out, "
        "and did error feedback send it later?"
    )
    return check_prediction(
        "warm_start_prediction",
        prediction,
        "higher" if worse else "lower",
        hint,
        f"In this run cumulative_rel_error ended at {mine:.3f} without warm start and {kept:.3f} with both switches "
        "on. Error feedback still re-sends what each step misses, whatever Q the power iteration started from.",
        malformed=lambda attempt: choice_problem(attempt, ("higher", "lower")),
    )


# -- exercise 2: the smallest matrix rank that saves no more bytes than fp16 ---------------------------------


def _shares(shapes: Sequence[tuple[int, ...]], matrix_rank: int, min_compression_rate: float) -> float:
    from ..studies.network import payload, rule_traffic

    fp32 = payload(rule_traffic(shapes, "allreduce"))
    traffic = rule_traffic(
        shapes, "power_sgd", matrix_approximation_rank=matrix_rank, min_compression_rate=min_compression_rate
    )
    return payload(traffic) / fp32


@reference("half_bytes_rank")
def half_bytes_rank(shapes: Sequence[tuple[int, ...]], min_compression_rate: float = MIN_COMPRESSION_RATE) -> int:
    """The smallest matrix rank at which PowerSGD sends at least half of fp32's bytes, from the byte rules:
    r(m+n) numbers per m x n matrix it compresses, every element of the others."""
    largest = max(min(s[0], math.prod(s) // s[0]) for s in shapes if s)  # beyond it nothing changes
    return next((r for r in range(1, largest + 1) if _shares(shapes, r, min_compression_rate) >= FP16_SHARE), largest)


def uncompressed_from(shapes: Sequence[tuple[int, ...]], min_compression_rate: float = MIN_COMPRESSION_RATE) -> dict:
    """For each matrix, the smallest matrix rank at which PowerSGD sends it uncompressed (``_should_compress``)."""
    out = {}
    for shape in shapes:
        if len(shape) < 2:
            continue
        rows = shape[0]
        cols = math.prod(shape) // rows
        r = next(
            (r for r in range(1, min(rows, cols) + 1) if (rows + cols) * r * min_compression_rate >= rows * cols),
            None,  # compressed at every matrix rank (possible with min_compression_rate < 1)
        )
        out["x".join(map(str, shape))] = r
    return out


def _measured_share(matrix_rank: int, cluster, model: str) -> float:
    from ..experiment import run

    result = run(
        hook="power_sgd",
        state_options={"matrix_approximation_rank": matrix_rank, "start_powerSGD_iter": 2},
        model=model,
        steps=3,
        measure=False,
        cluster=cluster,
    )
    return float(result.summary()["payload_vs_fp32"])


def check_half_bytes_rank(answer: Any, cluster=None, model: str = "mlp") -> Outcome:
    """Your matrix rank r: PowerSGD must send at least half of fp32's bytes at r, and less at r - 1 (measured).

    Wrong answers it recognises, each told by its own hint (the measured shares, never the answer):

    - too small, where one matrix goes uncompressed (5 for the mlp's 10 x 128): "goes uncompressed from";
    - too small otherwise (one below the answer, say): "look at larger matrix ranks";
    - too large, where nothing is compressed any more (22 for the mlp's 128 x 64): "every matrix goes
      uncompressed";
    - too large otherwise (one above the answer, say): "look at smaller matrix ranks".

    Malformed answers get a clear message instead: not a whole number >= 1 ("18", 0, 2.5, True).
    """
    from ..engine.models import build_task
    from ..studies.network import parameter_shapes

    name = "half_bytes_rank"
    shapes = parameter_shapes(build_task(model, 0).model)
    reference_answer = half_bytes_rank(shapes)
    if answer is None:
        return say(
            Outcome(
                NOT_ATTEMPTED,
                f"· {name}: not attempted yet. Find the matrix rank with the dashboard, write it in the cell above "
                f"and run both cells again (stuck? lab.exercises.reveal({name!r})).",
                reference_answer,
            )
        )
    if isinstance(answer, bool) or not isinstance(answer, numbers.Integral) or int(answer) < 1:
        return say(Outcome(WRONG, f"✗ {name}: a matrix rank is a whole number >= 1, got {answer!r}.", reference_answer))
    answer = int(answer)
    uncompressed = {shape: r for shape, r in uncompressed_from(shapes).items() if r is not None}
    share = _measured_share(answer, cluster, model)
    if share < FP16_SHARE:
        at = [shape for shape, r in uncompressed.items() if r == answer]
        where = (
            f"the {at[0]} matrix goes uncompressed from matrix rank {answer} on, but that is not enough: " if at else ""
        )
        return say(
            Outcome(
                WRONG,
                f"✗ {name}: not yet. At matrix rank {answer} PowerSGD sends {share:.1%} of fp32's bytes, less than "
                f"fp16's 50%: {where}look at larger matrix ranks.",
                reference_answer,
            )
        )
    below = _measured_share(answer - 1, cluster, model) if answer > 1 else 0.0
    if below >= FP16_SHARE:
        every = (
            bool(uncompressed)
            and len(uncompressed) == len(uncompressed_from(shapes))
            and answer >= max(uncompressed.values())
        )
        where = (
            f"at matrix rank {answer} every matrix goes uncompressed, so PowerSGD sends as much as fp32; the "
            "question asks where it first reaches half. "
            if every
            else ""
        )
        return say(
            Outcome(
                WRONG,
                f"✗ {name}: not yet. {where}At matrix rank {answer} PowerSGD sends {share:.1%} of fp32's bytes, and "
                "a smaller matrix rank already sends half: look at smaller matrix ranks, and at each layer's shape.",
                reference_answer,
            )
        )
    switches = ", ".join(f"{shape} from r = {r}" for shape, r in uncompressed_from(shapes).items() if r is not None)
    return say(
        Outcome(
            RIGHT,
            f"✓ {name}: right. Matrix rank {answer - 1} sends {below:.1%} of fp32's bytes, {answer} sends "
            f"{share:.1%}. PowerSGD sends r(m+n) numbers per m x n matrix, and a matrix goes uncompressed once "
            f"r(m+n) x min_compression_rate >= mn ({switches}): hence the jump you saw.",
            answer,
        )
    )

"""Checks for the notebooks' exercises: each prints what it verified, or raises saying what is off."""

from __future__ import annotations

import math

import torch


class ExerciseError(AssertionError):
    """An exercise check failed: the message says what to look at."""


def _check(condition: bool, passed: str, failed: str) -> None:
    if not condition:
        raise ExerciseError(failed)
    print(f"ok: {passed}")


def check_topk(topk) -> None:
    """``topk(x, k) -> (values, indices)`` keeps exactly the k largest magnitudes."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(7))
    values, indices = topk(x, 25)
    _check(
        len(values) == len(indices) == 25,
        "returns 25 values and 25 indices",
        f"expected 25 values and indices, got {len(values)} and {len(indices)}",
    )
    _check(
        torch.equal(x[indices.long()], values),
        "values are x at those indices",
        "values[i] must equal x[indices[i]] (send the signed value, not its magnitude)",
    )
    rest = torch.ones_like(x, dtype=torch.bool)
    rest[indices.long()] = False
    _check(
        bool(x[indices.long()].abs().min() > x[rest].abs().max()),
        "they are the 25 largest magnitudes",
        "a dropped entry is larger in magnitude than a kept one: rank by x.abs()",
    )


def check_compressed_hook(result, expected_payload_bytes: int, max_rel_error: float = math.inf) -> None:
    """A compressing hook run through the lab: ranks agree, bytes as designed, error bounded."""
    s = result.steps
    _check(
        bool((s["rank_spread"] == 0).all()),
        "every rank holds the same gradient (rank_spread = 0)",
        "ranks disagree: every rank must decode the same payloads the same way",
    )
    payload = int(s["payload_bytes"].iloc[-1])
    _check(
        payload == expected_payload_bytes,
        f"payload {payload} B per step, as designed",
        f"payload {payload} B per step, expected {expected_payload_bytes} B",
    )
    if math.isfinite(max_rel_error):
        worst = float(s["rel_error"].max())
        _check(
            worst <= max_rel_error,
            f"rel_error at most {max_rel_error:g}",
            f"rel_error reached {worst:.3g}, above {max_rel_error:g}",
        )


def check_error_feedback_helps(with_ef, without_ef) -> None:
    """Error feedback makes the *summed* gradient more accurate over the run."""
    a = with_ef.steps["cumulative_rel_error"].iloc[-1]
    b = without_ef.steps["cumulative_rel_error"].iloc[-1]
    _check(
        a < b,
        f"with error feedback the summed gradient is closer to exact ({a:.3f} < {b:.3f})",
        f"error feedback did not help ({a:.3f} >= {b:.3f}): is the residual added back before compressing?",
    )

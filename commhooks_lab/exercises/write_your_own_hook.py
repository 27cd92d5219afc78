"""Notebook 7's exercises: top-k of a tensor, a top-k hook with error feedback, EF-SignSGD.

No ``from __future__ import annotations`` here: DDP compares a hook's return annotation with
``torch.futures.Future[torch.Tensor]`` itself, and a string annotation would fail that check.

The hook checks run the learner's hook and the reference on the same data through the lab and
compare them step by step: same bytes, same error (to float32 rounding), all ranks agreeing.
"""

from typing import Any

import torch
import torch.distributed as dist

from ..hooks.contract import completed_future
from . import (
    NOT_ATTEMPTED,
    RIGHT,
    WRONG,
    Outcome,
    _say,
    check_function,
    check_prediction,
    reference,
    run_beside_reference,
)

__all__ = [
    "check_ef_prediction",
    "check_rng_prediction",
    "check_sign_ef_hook",
    "check_topk",
    "check_topk_ef_hook",
    "sign_ef_hook",
    "sign_state",
    "topk",
    "topk_ef_hook",
    "topk_state",
]

# -- references -------------------------------------------------------------------------------------


@reference("topk")
def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and indices of the k entries of x with the largest magnitude."""
    flat = x.reshape(-1)
    indices = flat.abs().topk(k).indices
    return flat[indices], indices


@reference("topk_ef_hook")
def topk_ef_hook(state: dict, bucket) -> torch.futures.Future[torch.Tensor]:
    """Top-k with error feedback: send the k largest of (gradient + residual), keep the rest.

    ``state``: {"ratio": 0.01, "error_feedback": True, "residuals": {}}.
    """
    world = dist.get_world_size()
    grad = bucket.buffer()
    corrected = grad + state["residuals"].get(bucket.index(), 0)
    k = max(1, int(state["ratio"] * grad.numel()))
    values, indices = topk(corrected, k)
    if state.get("error_feedback", True):
        sent = torch.zeros_like(corrected)
        sent[indices] = values
        state["residuals"][bucket.index()] = corrected - sent
    gathered_values = [torch.empty_like(values) for _ in range(world)]
    gathered_indices = [torch.empty_like(indices) for _ in range(world)]
    dist.all_gather(gathered_values, values)
    dist.all_gather(gathered_indices, indices)
    grad.zero_()
    for v, i in zip(gathered_values, gathered_indices):
        grad.index_add_(0, i, v)
    grad.div_(world)
    return completed_future(grad)


@reference("sign_ef_hook")
def sign_ef_hook(state: dict, bucket) -> torch.futures.Future[torch.Tensor]:
    """EF-SignSGD: send sign(gradient + residual) and one scale, mean |.|; keep what the signs missed."""
    world = dist.get_world_size()
    grad = bucket.buffer()
    corrected = grad + state["residuals"].get(bucket.index(), 0)
    scale = corrected.abs().mean().reshape(1)
    signs = torch.where(corrected >= 0, 1, -1).to(torch.int8)
    state["residuals"][bucket.index()] = corrected - scale * signs
    gathered_signs = [torch.empty_like(signs) for _ in range(world)]
    gathered_scales = [torch.empty_like(scale) for _ in range(world)]
    dist.all_gather(gathered_signs, signs)
    dist.all_gather(gathered_scales, scale)
    grad.copy_(sum(s * g for s, g in zip(gathered_scales, gathered_signs)) / world)
    return completed_future(grad)


def topk_state(process_group: Any, ratio: float = 0.01, error_feedback: bool = True) -> dict:
    """The state the top-k exercise's hook gets on every rank."""
    return {"ratio": ratio, "error_feedback": error_feedback, "residuals": {}}


def sign_state(process_group: Any) -> dict:
    return {"residuals": {}}


# -- checks -----------------------------------------------------------------------------------------


def _verify_topk(fn) -> str | None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(7))
    values, indices = fn(x, 25)
    if len(values) != 25 or len(indices) != 25:
        return f"expected 25 values and 25 indices, got {len(values)} and {len(indices)}."
    if not torch.equal(x[indices.long()], values):
        return "values[i] must equal x[indices[i]]: send the signed value, not its magnitude."
    rest = torch.ones_like(x, dtype=torch.bool)
    rest[indices.long()] = False
    if not bool(x[indices.long()].abs().min() > x[rest].abs().max()):
        return "a dropped entry is larger in magnitude than a kept one: rank the entries by x.abs(), not by x."
    return None


def check_topk(attempt) -> Outcome:
    """``topk(x, k) -> (values, indices)`` keeps exactly the k largest magnitudes."""
    return check_function("topk", attempt, _verify_topk, "25 values at their indices, the 25 largest magnitudes.")


def _compare_runs(attempt, ref, state_factory, steps: int, cluster, what: str, **changes: Any) -> str | None:
    a, b = run_beside_reference(attempt, ref, state_factory, steps, cluster, **changes)
    if (a["rank_spread"] != 0).any():
        return "the ranks disagree after your hook: every rank must decode the same payloads the same way."
    if (a["payload_bytes"] != b["payload_bytes"]).any():
        return (
            f"your hook sends {int(a['payload_bytes'].iloc[-1])} B per step, the design sends "
            f"{int(b['payload_bytes'].iloc[-1])} B: check the dtypes and sizes you all-gather."
        )
    differs = (a["rel_error"] - b["rel_error"]).abs() > 1e-5 * b["rel_error"].abs().clip(lower=1e-3)
    if differs.any():
        step = int(a["step"][differs].iloc[0])
        if step == 0:
            return (
                f"already at step 0 your gradient differs from {what} (rel_error {a['rel_error'].iloc[0]:.3g} vs "
                f"{b['rel_error'].iloc[0]:.3g}): check what you send and how you decode it."
            )
        return (
            f"steps before {step} match, step {step} does not (rel_error {a['rel_error'].iloc[step]:.3g} vs "
            f"{b['rel_error'].iloc[step]:.3g}): look at the residual — added before compressing, updated after."
        )
    return None


def _compare_both_switches(fn, cluster, steps: int) -> str | None:
    """With error feedback (the default state), then without: a hook that ignores the switch fails the second."""
    problem = _compare_runs(fn, topk_ef_hook, topk_state, steps, cluster, "top-k of gradient + residual")
    if problem is None:
        problem = _compare_runs(
            fn, topk_ef_hook, topk_state, steps, cluster, "top-k of the gradient alone",
            state_options={"error_feedback": False},
        )  # fmt: skip
        if problem is not None:
            problem = f"with error_feedback=False, {problem} Keep no residual when state['error_feedback'] is False."
    return problem


def check_topk_ef_hook(attempt, cluster=None, steps: int = 6) -> Outcome:
    """Run your hook and the reference on the same data, error feedback on and off: same bytes, same error."""
    return check_function(
        "topk_ef_hook",
        attempt,
        lambda fn: _compare_both_switches(fn, cluster, steps),
        f"Same bytes and the same error as the reference at every one of {steps} steps, error feedback on and off; "
        "the ranks agree.",
    )


def check_sign_ef_hook(attempt, cluster=None, steps: int = 6) -> Outcome:
    return check_function(
        "sign_ef_hook",
        attempt,
        lambda fn: _compare_runs(fn, sign_ef_hook, sign_state, steps, cluster, "mean|c| x sign(c)"),
        f"Same bytes and the same error as the reference at every one of {steps} steps; the ranks agree.",
    )


HIGHER_OR_LOWER = ("higher", "lower")
EF_METRICS = ("rel_error", "cumulative_rel_error")


def _ef_answer(with_ef, without_ef) -> dict:
    """With error feedback vs without: mean per-step rel_error and the last step's cumulative_rel_error."""
    per_step = with_ef.steps["rel_error"].mean() > without_ef.steps["rel_error"].mean()
    summed = with_ef.steps["cumulative_rel_error"].iloc[-1] > without_ef.steps["cumulative_rel_error"].iloc[-1]
    return {"rel_error": HIGHER_OR_LOWER[not per_step], "cumulative_rel_error": HIGHER_OR_LOWER[not summed]}


_EF_HINTS = {
    "rel_error": "rel_error compares h_t with this step's exact mean g_t. With error feedback, h_t = C(g_t + e_(t-1)): "
    "what does re-sending the old residual e_(t-1) do to the distance from g_t?",
    "cumulative_rel_error": "cumulative_rel_error compares the sums over steps. Add up h_t = C(c_t) = c_t - e_t "
    "with c_t = g_t + e_(t-1): which residuals are left in the sum? Without error feedback, where does what is "
    "dropped go?",
}


def check_ef_prediction(prediction: Any, with_ef, without_ef) -> Outcome:
    """A prediction {"rel_error": "higher"|"lower", "cumulative_rel_error": ...}: with error feedback vs without."""
    answer = _ef_answer(with_ef, without_ef)
    name = "ef_prediction"
    if prediction is None:
        return _say(
            Outcome(
                NOT_ATTEMPTED,
                f"· {name}: no prediction made. Write one in the prediction cell, then compare it with the "
                "measurement above.",
                answer,
            )
        )
    if not isinstance(prediction, dict) or set(prediction) != set(EF_METRICS):
        return _say(
            Outcome(
                WRONG,
                f"✗ {name}: write the prediction as a dict with the keys {list(EF_METRICS)}, each "
                f"{' or '.join(repr(v) for v in HIGHER_OR_LOWER)}.",
                answer,
            )
        )
    bad = [m for m in EF_METRICS if prediction[m] not in HIGHER_OR_LOWER]
    if bad:
        got = prediction[bad[0]]
        return _say(Outcome(WRONG, f"✗ {name}: {bad[0]} must be 'higher' or 'lower', got {got!r}.", answer))
    wrong = [m for m in EF_METRICS if prediction[m] != answer[m]]
    if wrong:
        return _say(Outcome(WRONG, f"✗ {name}: not yet for {wrong[0]}. {_EF_HINTS[wrong[0]]}", answer))
    return _say(
        Outcome(
            RIGHT,
            f"✓ {name}: right. Each step's h_t carries old residuals, so it is further from g_t; summed over steps "
            "only the last residual is missing (sum of h_t = sum of g_t - e_T), while without error feedback every "
            "dropped entry is lost for good.",
            answer,
        )
    )


def check_rng_prediction(prediction: Any, draws: list) -> Outcome:
    """A prediction, "same" or "different": do the ranks draw the same random numbers inside a hook?"""
    same = all(d == draws[0] for d in draws)
    return check_prediction(
        "rng_prediction",
        prediction,
        "same" if same else "different",
        "Look at how the worker seeds torch, and at which generator torch.rand uses when you pass none.",
        "Every rank seeded torch's global generator with the same number, so every rank draws the same stream.",
    )

"""Notebook 10's exercises: make a bucket-only hook compile-safe (checked eagerly and under compiled
autograd on two real ranks, against the exact mean), and predict what a resume without hook state sends."""

from typing import Any

import torch.distributed as dist

from ..hooks.contract import completed_future
from . import Outcome, check_function, check_prediction, reference

__all__ = ["bytes_answer", "check_bytes_prediction", "check_compile_safe_hook", "compile_safe_mean_hook"]


@reference("compile_safe_hook")
def compile_safe_mean_hook(state, bucket):
    grad = bucket[0] if isinstance(bucket, tuple) else bucket.buffer()  # (param.grad, param) or a GradBucket
    grad.div_(dist.get_world_size(state))
    dist.all_reduce(grad, group=state)  # waits: the mean is in grad before the hook returns
    if isinstance(bucket, tuple):
        return grad  # ignored by DDP; creating a Future here would break the compiled graph
    return completed_future(grad)


def _verify_compile_safe(fn, cluster) -> str | None:
    from ..studies.compile_matrix import compile_compatibility

    table = compile_compatibility([fn, compile_safe_mean_hook], modes=("eager", "compiled_autograd"), cluster=cluster)
    yours, exact = table.iloc[0:2], table.iloc[2]  # rows: yours eager, yours compiled autograd, the reference...
    eager, compiled = yours.iloc[0], yours.iloc[1]
    if not eager["runs"]:
        return (
            f"it fails in eager DDP already ({eager['error']}): for a GradBucket DDP needs a Future that holds "
            "the averaged bucket tensor, e.g. completed_future(tensor)."
        )
    if eager["grad_sha256"] != exact["grad_sha256"]:
        return "in eager DDP it does not leave the exact mean: divide the bucket by the world size, then all-reduce it."
    if not compiled["runs"]:
        if "'tuple' object has no attribute" in compiled["error"]:
            return (
                f"under compiled autograd it fails with {compiled['error']}: DDP passes (param.grad, param) there; "
                "take bucket[0] when isinstance(bucket, tuple), else bucket.buffer()."
            )
        return f"under compiled autograd it fails: {compiled['error']}"
    if compiled["grad_sha256"] != exact["grad_sha256"]:
        return (
            "it runs under compiled autograd but leaves another gradient: DDP ignores what the hook returns there, "
            "so the mean must be in the gradient before the hook returns (a synchronous all_reduce, no .then())."
        )
    return None


def check_compile_safe_hook(attempt, cluster=None) -> Outcome:
    """Your hook in eager DDP and under compiled autograd: the exact mean both times."""
    return check_function(
        "compile_safe_hook",
        attempt,
        lambda fn: _verify_compile_safe(fn, cluster),
        "It leaves the exact mean, bit for bit, in eager DDP and under compiled autograd.",
    )


def bytes_answer(with_state, without_state, resumed_at: int) -> str:
    """'more', 'fewer' or 'same': what the resumed-without-state run hands to collectives after the resume."""
    after = slice(resumed_at, None)
    mine = without_state.steps["payload_bytes"].iloc[after].sum()
    kept = with_state.steps["payload_bytes"].iloc[after].sum()
    return "more" if mine > kept else "fewer" if mine < kept else "same"


def check_bytes_prediction(prediction: Any, with_state, without_state, resumed_at: int) -> Outcome:
    """Prediction: after the resume, does the run without hook state send 'more', 'fewer' or the 'same' bytes?"""
    return check_prediction(
        "resume_bytes",
        prediction,
        bytes_answer(with_state, without_state, resumed_at),
        "a new PowerSGDState starts with iter = 0: what does PowerSGD do before start_powerSGD_iter?",
        "A new PowerSGDState counts from iter 0 again, and PowerSGD sends plain float32 all-reduces until "
        "start_powerSGD_iter.",
    )

"""Notebook 11's exercises: make a bucket-only hook compile-safe (checked eagerly and under compiled
autograd on two real ranks, against the exact mean, and for graph breaks in the compiled backward; then eagerly
at 3 and 4 ranks), and predict what a resume without hook state sends."""

from typing import Any

import torch.distributed as dist

from .. import _compat
from ..hooks.contract import completed_future
from .checking import (
    WORLD_SIZES,
    Outcome,
    check_function,
    check_prediction,
    choice_problem,
    first_problem_by_world_size,
    reference,
)

__all__ = ["bytes_answer", "check_bytes_prediction", "check_compile_safe_hook", "compile_safe_mean_hook"]


@reference("compile_safe_hook")
def compile_safe_mean_hook(state, bucket):
    grad = bucket[0] if isinstance(bucket, tuple) else bucket.buffer()  # (param.grad, param) or a GradBucket
    grad.div_(dist.get_world_size(state))
    dist.all_reduce(grad, group=state)  # waits: the mean is in grad before the hook returns
    if isinstance(bucket, tuple):
        return grad  # ignored by DDP; creating a Future here would break the compiled graph
    return completed_future(grad)


def _verify_compile_safe(fn, cluster, world_sizes=WORLD_SIZES) -> str | None:
    """Both forms at the first world size, then eager DDP alone at the others: a 2 written for the world size is
    wrong in both forms alike, and compiled autograd costs each rank seconds of Dynamo's tracing, which 3 and 4
    ranks at once would multiply on a laptop."""

    def at(ranks) -> str | None:
        return _compile_safe_problem(fn, ranks, eager_only=ranks.world_size != world_sizes[0])

    return first_problem_by_world_size(at, cluster, world_sizes)


def _compile_safe_problem(fn, cluster, eager_only: bool = False) -> str | None:
    """Eager first: an attempt that is wrong there already is told so without a compiled-autograd case (about a
    CPU-second a rank). The reference's rows are computed once per process (``compile_compatibility`` caches each
    hook)."""
    from ..studies.compile_matrix import compile_compatibility

    def rows(mode: str) -> list:  # yours, then the reference's
        table = compile_compatibility([fn, compile_safe_mean_hook], modes=(mode,), cluster=cluster)
        return [row for _, row in table.iterrows()]

    eager, exact = rows("eager")
    if not eager["runs"]:
        return (
            f"it fails in eager DDP already ({eager['error']}): for a GradBucket DDP needs a Future that holds "
            "the averaged bucket tensor, e.g. completed_future(tensor)."
        )
    if eager["grad_sha256"] != exact["grad_sha256"]:
        return "in eager DDP it does not leave the exact mean: divide the bucket by the world size, then all-reduce it."
    if eager_only:
        return None
    compiled, reference_compiled = rows("compiled_autograd")
    if not compiled["runs"]:
        if "'tuple' object has no attribute" in compiled["error"]:
            return (
                f"under compiled autograd it fails with {compiled['error']}: DDP passes (param.grad, param) there; "
                "take bucket[0] when isinstance(bucket, tuple), else bucket.buffer()."
            )
        return f"under compiled autograd it fails: {compiled['error']}"
    # Against the reference's own compiled-autograd gradient, not its eager one: compiled autograd all-reduces each
    # gradient alone, eager DDP one flat bucket, and from three ranks on gloo sums the two in another order (the last
    # bit differs: the reference itself would fail against its eager gradient).
    if compiled["grad_sha256"] != reference_compiled["grad_sha256"]:
        return (
            "it runs under compiled autograd but leaves another gradient: DDP ignores what the hook returns there, "
            "so the mean must be in param.grad itself before the hook returns: divide that tensor in place (div_) "
            "and all-reduce it, synchronously (no .then()), not a copy of it."
        )
    if compiled["graph_breaks"] > reference_compiled["graph_breaks"]:  # the reference has none
        return _graph_break_hint(int(compiled["graph_breaks"]), str(compiled["graph_break"]))
    return None


def _graph_break_hint(count: int, reasons: str) -> str:
    """Step 3: under compiled autograd the hook must not build a Future (Dynamo cannot trace one)."""
    breaks = f"{count} graph break{'s' if count != 1 else ''}"
    said = reasons.split(" | ")
    future = [why for why in said if _compat.is_future_graph_break(why)]
    if future:
        return (
            f"the gradient is right in both forms, but Dynamo counted {breaks} in the backward compiled autograd "
            f"traced ({future[0]}): that is your hook making a torch.futures.Future (completed_future makes one "
            "too). DDP ignores what the hook returns there: for the tuple, return the tensor itself."
        )
    return (
        f"the gradient is right in both forms, but Dynamo counted {breaks} in the backward compiled autograd "
        f"traced ({said[0]}): on the tuple path, keep to tensor work and the collective."
    )


def check_compile_safe_hook(attempt, cluster=None, world_sizes=WORLD_SIZES) -> Outcome:
    """Your hook in eager DDP and under compiled autograd: the exact mean both times, no graph break compiled; then
    in eager DDP at 3 and 4 ranks.

    ``cluster``: a Cluster, or several, used for the world sizes they have; the others get ranks started for them.

    Wrong answers it recognises, each told by its own hint: the bucket-only hook, which fails on the tuple ("take
    bucket[0] when isinstance(bucket, tuple)"); no division ("divide the bucket"); no Future in eager DDP
    ("completed_future(tensor)"); a Future built on the tuple path too, by completed_future ("return the tensor
    itself") or by hand ("making a torch.futures.Future"); a copy reduced under compiled autograd, not
    param.grad itself ("divide that tensor in place"); another graph break ("keep to tensor work"); a division by
    2, not by the world size ("right at 2 ranks, but at 3").
    """
    more = ", ".join(map(str, world_sizes[1:]))
    return check_function(
        "compile_safe_hook",
        attempt,
        lambda fn: _verify_compile_safe(fn, cluster, world_sizes),
        f"It leaves the exact mean, bit for bit, in eager DDP and under compiled autograd at {world_sizes[0]} ranks, "
        "and the compiled backward has no graph break" + (f"; in eager DDP at {more} ranks too." if more else "."),
    )


def bytes_answer(with_state, without_state, resumed_at: int) -> str:
    """'more', 'fewer' or 'same': what the resumed-without-state run hands to collectives after the resume."""
    after = slice(resumed_at, None)
    mine = without_state.steps["payload_bytes"].iloc[after].sum()
    kept = with_state.steps["payload_bytes"].iloc[after].sum()
    return "more" if mine > kept else "fewer" if mine < kept else "same"


def check_bytes_prediction(prediction: Any, with_state, without_state, resumed_at: int) -> Outcome:
    """Prediction: after the resume, does the run without hook state send 'more', 'fewer' or the 'same' bytes?

    A prediction with three choices has two wrong ones; each choice has its own hint for when the measurement says
    otherwise (none says the answer):

    - "same" ("a resume restores everything"): "what does PowerSGD do before start_powerSGD_iter";
    - "fewer": "its own counter";
    - "more": "where state.iter stands".

    The general hint, "what a new PowerSGDState", is the fallback for any other wrong answer.

    Malformed answers get a clear message instead: not a str, or a misspelt choice ("More", "higher").
    """
    slips = [
        ("same", "a new PowerSGDState starts with iter = 0: what does PowerSGD do before start_powerSGD_iter?"),
        (
            "fewer",
            "what PowerSGD sends depends on its own counter, state.iter, not on the training step: where does that "
            "counter stand in a new PowerSGDState, and what does PowerSGD send while it is below "
            "start_powerSGD_iter?",
        ),
        (
            "more",
            "what PowerSGD sends after a resume depends on where state.iter stands against start_powerSGD_iter: "
            "compare the saved PowerSGDState with a new one, and the bytes each run sent after the resume.",
        ),
    ]
    return check_prediction(
        "resume_bytes",
        prediction,
        bytes_answer(with_state, without_state, resumed_at),
        "compare what a new PowerSGDState and the saved one do at the steps after the resume: which of them has "
        "passed start_powerSGD_iter?",
        "A new PowerSGDState counts from iter 0 again, and PowerSGD sends plain float32 all-reduces until "
        "start_powerSGD_iter.",
        slips=slips,
        malformed=lambda attempt: choice_problem(attempt, ("more", "fewer", "same")),
    )

"""Notebook 5's exercises: write Accelerate's DistributedDataParallelKwargs; predict what the FP16 wrapper does.

The kwargs check reads the fields Accelerate itself reads in ``DistributedDataParallelKwargs.register_comm_hook``
(``comm_hook`` and ``comm_wrapper`` looked up in dicts keyed by ``DDPCommunicationHookType`` members,
``comm_state_option`` passed to ``PowerSGDState``), so it decides without starting processes and can name
each plausible mistake, including the silent ones.
"""

from __future__ import annotations

from typing import Any

from .checking import Outcome, check_function, check_prediction, choice_problem, reference

__all__ = [
    "check_fp16_wrapper_prediction",
    "check_combined_kwargs",
    "fp16_wrapper_effect",
    "combined_kwargs",
]

#: The exercise: the guide's two Accelerate examples combined, compressing the last COMPRESSED_SHARE of a
#: RUN_STEPS-step run (steps count from 0).
MATRIX_RANK = 2
RUN_STEPS = 10
COMPRESSED_SHARE = 0.7
FIRST_COMPRESSED_STEP = RUN_STEPS - round(COMPRESSED_SHARE * RUN_STEPS)
#: A per-step rel_error ratio within this band of 1 counts as "about the same".
SAME_WITHIN = 0.01
CHOICES = ("lower", "about the same", "higher")

# -- references -------------------------------------------------------------------------------------


@reference("combined_kwargs")
def combined_kwargs():
    """PowerSGD of matrix rank 2 inside the FP16 wrapper, compressing the last 70% of a 10-step run."""
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    return DistributedDataParallelKwargs(
        comm_hook=DDPCommunicationHookType.POWER_SGD,
        comm_wrapper=DDPCommunicationHookType.FP16,
        comm_state_option={"matrix_approximation_rank": 2, "start_powerSGD_iter": 3},
    )


# -- checks -----------------------------------------------------------------------------------------


def _verify_kwargs(fn) -> str | None:
    from accelerate.utils import DDPCommunicationHookType as Hook
    from accelerate.utils import DistributedDataParallelKwargs

    from .._compat import power_sgd_defaults

    kwargs = fn()
    if not isinstance(kwargs, DistributedDataParallelKwargs):
        return f"return a DistributedDataParallelKwargs, not {type(kwargs).__name__}."
    for field in ("comm_hook", "comm_wrapper"):
        value = getattr(kwargs, field)
        if not isinstance(value, Hook):
            return (
                f"{field}={value!r} is not a DDPCommunicationHookType member. Accelerate looks {field} up in a dict "
                "keyed by the enum's members, so a plain string finds nothing and no hook is registered, without "
                "an error."
            )
    if kwargs.comm_hook == Hook.FP16 and kwargs.comm_wrapper == Hook.POWER_SGD:
        return (
            "hook and wrapper are swapped: Accelerate's comm_wrapper takes only NO, FP16 or BF16 (a wrapper around "
            "another hook); it would register the plain FP16 hook and ignore POWER_SGD."
        )
    if kwargs.comm_hook != Hook.POWER_SGD:
        return f"comm_hook={kwargs.comm_hook} is not the hook both of the guide's examples compress with."
    if kwargs.comm_wrapper != Hook.FP16:
        return f"comm_wrapper={kwargs.comm_wrapper}: the guide's comm_wrapper example wraps PowerSGD in another type."
    options = dict(kwargs.comm_state_option)
    defaults = power_sgd_defaults()
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        return f"PowerSGDState takes no {unknown}: comm_state_option holds PowerSGDState's keyword arguments."
    not_whole = sorted(
        k for k in ("matrix_approximation_rank", "start_powerSGD_iter") if k in options and type(options[k]) is not int
    )
    if not_whole:
        return (
            f"{', '.join(not_whole)} must be a whole number (an int, not {type(options[not_whole[0]]).__name__}): "
            "PowerSGD sizes its matrices and counts its steps with them."
        )
    if options.get("matrix_approximation_rank", defaults["matrix_approximation_rank"]) != MATRIX_RANK:
        return f"PowerSGD's matrix rank should be {MATRIX_RANK}, as in the guide's comm_state_option example."
    start = options.get("start_powerSGD_iter", defaults["start_powerSGD_iter"])
    if start != FIRST_COMPRESSED_STEP:
        compressed = min(max(RUN_STEPS - start, 0), RUN_STEPS)
        return (
            f"with start_powerSGD_iter={start} the first compressed step is step {start} (PowerSGD counts steps from "
            f"0 and runs plain all-reduce while its counter is below start_powerSGD_iter), so it compresses "
            f"{compressed} of the run's {RUN_STEPS} steps, {compressed / RUN_STEPS:.0%}; the exercise asks for the "
            f"last {COMPRESSED_SHARE:.0%}."
        )
    changed = sorted(
        k
        for k, v in options.items()
        if k not in ("matrix_approximation_rank", "start_powerSGD_iter") and v != defaults[k]
    )
    if changed:
        return f"the guide keeps PowerSGD's other defaults; you changed {changed}."
    return None


def check_combined_kwargs(attempt) -> Outcome:
    """``combined_kwargs() -> DistributedDataParallelKwargs`` for the exercise's configuration.

    Wrong answers it recognises, each told by its own hint: the guide's example as is, start_powerSGD_iter left at
    1000 ("compresses 0 of"); any other start step, one too early, one too late, or the share of the run taken as
    the first step ("compresses ... of the run's"), each told how many of the run's steps it compresses; hook and
    wrapper swapped
    ("swapped"); plain strings, which Accelerate silently ignores ("no hook is registered"); the wrapper NO
    ("wraps PowerSGD"); BATCHED_POWER_SGD ("not the hook"); matrix rank left at 1 ("matrix rank should be 2");
    another default changed ("other defaults"); an argument PowerSGDState does not take ("PowerSGDState takes
    no"); a float where PowerSGD needs an int ("a whole number"); a dict instead of the dataclass ("return a
    DistributedDataParallelKwargs").
    """
    return check_function(
        "combined_kwargs",
        attempt,
        _verify_kwargs,
        f"PowerSGD of matrix rank {MATRIX_RANK} inside the FP16 wrapper, compressing steps {FIRST_COMPRESSED_STEP} "
        f"to {RUN_STEPS - 1}, the last {COMPRESSED_SHARE:.0%} of a {RUN_STEPS}-step run.",
    )


def fp16_wrapper_effect(plain: Any, wrapped: Any, first_step: int) -> str:
    """Compare per-step rel_error of two runs on the steps where PowerSGD itself compressed (from ``first_step``)."""
    a = plain.steps["rel_error"].iloc[first_step:].to_numpy()
    b = wrapped.steps["rel_error"].iloc[first_step:].to_numpy()
    ratio = float(b.mean() / a.mean())
    if abs(ratio - 1) <= SAME_WITHIN:
        return "about the same"
    return "lower" if ratio < 1 else "higher"


def check_fp16_wrapper_prediction(prediction: Any, plain: Any, wrapped: Any, first_step: int) -> Outcome:
    """Predicted: at PowerSGD's own steps, is rel_error with the FP16 wrapper lower, about the same, or higher?

    A prediction with three choices has two wrong ones; each gets its own hint (none says the answer):

    - "lower", where it is not ("rounding can only help"): "Can rounding each number make";
    - "higher", where it is not ("float16 adds error"): "how large is it next to";
    - "about the same", where it is not: the general hint, "compare the two sizes of error".

    Malformed answers get a clear message instead: not a str (a number, a bool) or a misspelt choice ("less",
    "same", "Higher").
    """
    answer = fp16_wrapper_effect(plain, wrapped, first_step)
    general = (
        "compare the two sizes of error involved: what rounding to float16 adds to each number (its unit "
        "roundoff) and what PowerSGD of matrix rank 1 leaves out of the gradient at each step."
    )
    slips = [
        ("lower", f"Can rounding each number to float16 make PowerSGD's approximation better? {general}"),
        (
            "higher",
            "Rounding to float16 does add error: how large is it next to what PowerSGD of matrix rank 1 leaves "
            "out at each step? Compare float16's unit roundoff with PowerSGD's per-step rel_error.",
        ),
    ]
    return check_prediction(
        "fp16_wrapper",
        prediction,
        answer,
        general,
        "Rounding to float16 costs about its unit roundoff, 2^-11 ≈ 4.9e-4, per number (more for subnormals and "
        "after float16 arithmetic); PowerSGD's per-step error at matrix rank 1 is close to 1, so PowerSGD decides.",
        slips=slips,
        malformed=lambda attempt: choice_problem(attempt, CHOICES),
    )

"""Notebook 3's exercises: which values survive a 16-bit cast, and the compress hooks' arithmetic in one process.

Answers are computed with torch from the inputs (never hard-coded), and the simulation is checked
bit for bit against the reference on fixed inputs chosen so that each usual mistake changes the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import NOT_ATTEMPTED, RIGHT, WRONG, Outcome, _say, check_function, reference

__all__ = ["check_simulate_compress", "check_within_one_percent", "simulate_compress", "survives"]

FORMATS = {"float16": torch.float16, "bfloat16": torch.bfloat16}

# -- prediction: which values survive a cast within 1% --------------------------------------------------


def survives(entries: Sequence[float], dtype: torch.dtype, tolerance: float = 0.01) -> list[bool]:
    """For each entry: is |cast(x) - x| / |x| below ``tolerance`` after a round trip through ``dtype``?"""
    x = torch.tensor(list(entries), dtype=torch.float32)
    return (((x.to(dtype).float() - x).abs() / x.abs()) < tolerance).tolist()


def check_within_one_percent(prediction: Any, entries: Sequence[float]) -> Outcome:
    """``prediction`` = {"float16": [bool per entry], "bfloat16": [...]}, committed before the casts are shown."""
    answer = {name: survives(entries, dtype) for name, dtype in FORMATS.items()}
    if prediction is None:
        return _say(
            Outcome(
                NOT_ATTEMPTED,
                "· within_one_percent: no prediction made. Fill in my_prediction before looking at the casts, "
                "then run this cell again.",
                answer,
            )
        )
    if not isinstance(prediction, dict) or set(prediction) != set(FORMATS):
        return _say(Outcome(WRONG, '✗ within_one_percent: give a dict with keys "float16" and "bfloat16".', answer))
    problems = []
    for name, dtype in FORMATS.items():
        mine = list(prediction[name])
        if len(mine) != len(entries):
            problems.append(f"{name}: give {len(entries)} answers, one per entry")
            continue
        wrong = [str(x) for x, a, b in zip(entries, mine, answer[name]) if bool(a) != b]
        if wrong:
            info = torch.finfo(dtype)
            problems.append(
                f"{name} is not right for {', '.join(wrong)}: is each above {name}'s largest finite value "
                f"({info.max:.4g}), below its smallest normal ({info.tiny:.3g}), where the spacing of representable "
                f"numbers stops shrinking with x, or below half its smallest subnormal?"
            )
    if problems:
        return _say(Outcome(WRONG, "✗ within_one_percent: not yet. " + "; ".join(problems), answer))
    return _say(
        Outcome(
            RIGHT,
            "✓ within_one_percent: right. Relative precision is constant (u) between the smallest normal and the "
            "largest value; below the smallest normal the spacing is fixed, so the relative error grows as x shrinks.",
            answer,
        )
    )


# -- the compress hooks' arithmetic in one process --------------------------------------------------------


@reference("simulate_compress")
def simulate_compress(local_grads: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """What fp16_compress_hook / bf16_compress_hook leave in .grad, computed in one process.

    Each rank casts its gradient to ``dtype`` and divides by W there; the all-reduce sums those
    ``dtype`` tensors (here in rank order), and the sum is cast back to float32.
    """
    world = len(local_grads)
    total = None
    for grad in local_grads:
        sent = grad.to(dtype).div_(world)
        total = sent if total is None else total + sent
    assert total is not None
    return total.to(torch.float32)


def _test_inputs() -> list[list[torch.Tensor]]:
    """Ranks' gradients (two, and once three) on which each usual mistake changes at least one bit of the result."""
    gen = torch.Generator().manual_seed(3)
    ordinary = [torch.randn(256, generator=gen) * 0.01 for _ in range(2)]
    cancelling = [ordinary[0][:64], -ordinary[0][:64] * (1 + 2.0**-9)]  # g0 + g1 ~ 0: the sum is all rounding
    tiny = [torch.tensor([2.0**-24, 3 * 2.0**-24, 1e-6, 3e-5]), torch.tensor([2.0**-24, 2.0**-24, 2e-6, 1e-5])]
    huge = [torch.tensor([40000.0, 3.0e38, 1.0]), torch.tensor([40000.0, 3.0e38, 1.0])]
    # a float16-normal value whose half is subnormal: cast-then-divide and divide-then-cast round differently
    halved = [torch.tensor([1029.4 * 2.0**-24, 1.0]), torch.tensor([1029.4 * 2.0**-24, 1.0])]
    three = [torch.tensor([1.0, 0.1]), torch.tensor([2.0**-11, 0.2]), torch.tensor([2.0**-11, 0.3])]  # W = 3, order
    return [ordinary, cancelling, tiny, huge, halved, three]


def _cast_once(grads: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return (sum(g.double() for g in grads) / len(grads)).to(dtype).float()  # type: ignore[union-attr]


def _divide_after(grads: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    total = None
    for g in grads:
        total = g.to(dtype) if total is None else total + g.to(dtype)
    assert total is not None
    return total.float() / len(grads)


def _no_divide(grads: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return _divide_after(grads, dtype) * len(grads)


def _sum_in_float32(grads: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return sum(g.to(dtype).div(len(grads)).float() for g in grads)  # type: ignore[return-value]


def _divide_then_cast(grads: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return _sum_sent([(g / len(grads)).to(dtype) for g in grads])


def _sum_sent(sent: list[torch.Tensor]) -> torch.Tensor:
    total = sent[0]
    for part in sent[1:]:
        total = total + part
    return total.to(torch.float32)


def _by_two(grads: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return _sum_sent([g.to(dtype).div_(2) for g in grads])


def _reversed_order(grads: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return _sum_sent([g.to(dtype).div_(len(grads)) for g in reversed(grads)])


def _stack_sum(grads: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return torch.stack([g.to(dtype).div_(len(grads)) for g in grads]).sum(0).float()


_MISTAKES: list[tuple[str, Callable[[list[torch.Tensor], torch.dtype], torch.Tensor]]] = [
    (
        "You rounded once, after averaging in high precision. The hook has no exact mean to round: each rank "
        "rounds its own gradient to the 16-bit format before anything is sent.",
        _cast_once,
    ),
    (
        "You divided by W after the sum; the hook divides on each rank, before the all-reduce (see _compress_hook "
        "in default_hooks.py). On tiny or huge values the two differ.",
        _divide_after,
    ),
    ("Your result is W times the mean: divide each rank's part by W.", _no_divide),
    (
        "You divided before casting; the hook casts each rank's gradient to the 16-bit format first, then divides "
        "there (buffer.to(dtype).div_(world_size)).",
        _divide_then_cast,
    ),
    ("You divided by 2: divide by W, the number of local gradients you were given.", _by_two),
    ("You added the ranks in reverse order; add them in rank order, 0 first.", _reversed_order),
    (
        "torch.sum over a stack of 16-bit tensors adds in float32 and rounds once; the all-reduce rounds after every "
        "addition: add the ranks one by one.",
        _stack_sum,
    ),
    (
        "You summed in float32. The all-reduce adds 16-bit tensors, so each addition rounds to the 16-bit format too.",
        _sum_in_float32,
    ),
]


def _verify_simulate(fn) -> str | None:
    for inputs in _test_inputs():
        for name, dtype in FORMATS.items():
            got = fn([g.clone() for g in inputs], dtype)
            if not isinstance(got, torch.Tensor) or got.shape != inputs[0].shape:
                return f"Return one tensor of the gradient's shape {tuple(inputs[0].shape)}."
            if got.dtype != torch.float32:
                return f"You returned {got.dtype}: the hook casts the sum back to float32 (the bucket's dtype)."
            want = simulate_compress([g.clone() for g in inputs], dtype)
            if torch.equal(got, want):
                continue
            other = FORMATS["bfloat16" if name == "float16" else "float16"]
            if torch.equal(got, simulate_compress([g.clone() for g in inputs], other)):
                return f"Asked for {name} you computed in the other format: use the dtype argument."
            for hint, mistake in _MISTAKES:
                if torch.equal(got, mistake([g.clone() for g in inputs], dtype)):
                    return hint
            return (
                f"In {name}, on fixed test gradients your result differs from the hook's in "
                f"{int((got != want).sum())} of {got.numel()} entries: cast each rank's gradient, divide by W, "
                "add in that format, cast back."
            )
    return None


def check_simulate_compress(attempt) -> Outcome:
    """``simulate_compress(local_grads, dtype)`` against the reference, bit for bit, on fixed inputs of two and
    three ranks."""
    return check_function(
        "simulate_compress",
        attempt,
        _verify_simulate,
        "Bit for bit the hook's arithmetic in float16 and bfloat16, on ordinary, cancelling, tiny and huge values, "
        "and on three ranks.",
    )

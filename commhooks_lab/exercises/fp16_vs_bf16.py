"""Notebook 3's exercises: which values survive a 16-bit cast, and the compress hooks' arithmetic in one process.

Answers are computed with torch from the inputs (never hard-coded), and the simulation is checked
bit for bit against the reference on fixed inputs chosen so that each usual mistake changes the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .checking import NOT_ATTEMPTED, RIGHT, WRONG, Outcome, check_function, reference, say

__all__ = ["check_simulate_compress", "check_within_one_percent", "simulate_compress", "survives"]

FORMATS = {"float16": torch.float16, "bfloat16": torch.bfloat16}

# -- prediction: which values survive a cast within 1% --------------------------------------------------


def survives(entries: Sequence[float], dtype: torch.dtype, tolerance: float = 0.01) -> list[bool]:
    """For each entry: is |cast(x) - x| / |x| below ``tolerance`` after a round trip through ``dtype``?"""
    x = torch.tensor(list(entries), dtype=torch.float32)
    return (((x.to(dtype).float() - x).abs() / x.abs()) < tolerance).tolist()


def _regime_hint(x: float, name: str, dtype: torch.dtype) -> str:
    """Where ``x`` lies in ``dtype``'s range, as a question (never the verdict)."""
    info = torch.finfo(dtype)
    if abs(x) > info.max:
        return f"{x} lies above {name}'s largest finite value ({info.max:.4g}): what does a cast make of it?"
    if abs(x) < info.tiny:
        spacing = info.tiny * info.eps  # the subnormals' fixed spacing
        return (
            f"{x} lies below {name}'s smallest normal ({info.tiny:.3g}), where neighbouring values are a fixed "
            f"{spacing:.3g} apart: how far can rounding move {x}, next to 1% of it?"
        )
    return (
        f"{x} lies in {name}'s normal range, where rounding moves a number by at most the unit roundoff "
        f"(torch.finfo(torch.{name}).eps / 2) of its size: compare that with 1%"
    )


def check_within_one_percent(prediction: Any, entries: Sequence[float]) -> Outcome:
    """``prediction`` = {"float16": [bool per entry], "bfloat16": [...]}, committed before the casts are shown.

    Wrong answers it recognises, each told by its own hint (none gives an entry's verdict):

    - every entry survives in both formats ("1% is generous"): "every entry to survive";
    - the same answers for both formats: "the same answers";
    - each format given the other's answers: "which format has which range";
    - otherwise, per wrong entry, where it lies: above the largest finite value ("what does a cast make of it"),
      below the smallest normal ("a fixed ... apart": every subnormal failing, say), or in the normal range
      ("compare that with 1%": bfloat16 losing tiny values, say).

    Malformed answers get a clear message instead: not a dict with the two keys ("fp16" for "float16", say), a
    list of the wrong length, an entry that is not True or False ("yes").
    """
    answer = {name: survives(entries, dtype) for name, dtype in FORMATS.items()}
    if prediction is None:
        return say(
            Outcome(
                NOT_ATTEMPTED,
                "· within_one_percent: no prediction made. Fill in my_prediction before looking at the casts, "
                "then run this cell again.",
                answer,
            )
        )
    if not isinstance(prediction, dict) or set(prediction) != set(FORMATS):
        return say(Outcome(WRONG, '✗ within_one_percent: give a dict with keys "float16" and "bfloat16".', answer))
    problems, mine = [], {}
    for name in FORMATS:
        try:
            mine[name] = list(prediction[name])
        except TypeError:
            problems.append(f"{name}: give a list of {len(entries)} answers, one per entry")
            continue
        if len(mine[name]) != len(entries):
            problems.append(f"{name}: give {len(entries)} answers, one per entry")
        elif not all(isinstance(a, bool) or type(a).__name__ == "bool_" for a in mine[name]):
            odd = next(a for a in mine[name] if not (isinstance(a, bool) or type(a).__name__ == "bool_"))
            problems.append(f"{name}: answer True or False for each entry, not {odd!r}")
    if problems:
        return say(Outcome(WRONG, "✗ within_one_percent: " + "; ".join(problems) + ".", answer))
    mine = {name: [bool(a) for a in values] for name, values in mine.items()}
    if mine == answer:
        return say(
            Outcome(
                RIGHT,
                "✓ within_one_percent: right. Relative precision is constant (u) between the smallest normal and "
                "the largest value; below the smallest normal the spacing is fixed, so the relative error grows as "
                "x shrinks.",
                answer,
            )
        )
    fp16, bf16 = mine["float16"], mine["bfloat16"]
    if all(fp16) and all(bf16):
        problems = [
            "you expect every entry to survive in both formats. 1% is far above either format's unit roundoff, but "
            "a cast can also overflow or underflow: where does each format's range end?"
        ]
    elif fp16 == bf16 and answer["float16"] != answer["bfloat16"]:
        problems = [
            "you gave both formats the same answers, but they split their 16 bits differently: float16 keeps more "
            "significand bits, bfloat16 more exponent bits. Compare their ranges (torch.finfo(dtype).max, .tiny)."
        ]
    elif fp16 == answer["bfloat16"] and bf16 == answer["float16"]:
        problems = [
            "check which format has which range: torch.finfo(torch.float16) and torch.finfo(torch.bfloat16) give "
            "each one's max and tiny (its smallest normal)."
        ]
    else:
        for name, dtype in FORMATS.items():
            wrong = [x for x, a, b in zip(entries, mine[name], answer[name]) if a != b]
            if wrong:
                problems.append(
                    f"{name} is not right for {', '.join(str(x) for x in wrong)}: "
                    + "; ".join(_regime_hint(x, name, dtype) for x in wrong)
                )
    return say(Outcome(WRONG, "✗ within_one_percent: not yet. " + "; ".join(problems), answer))


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
    three ranks.

    Wrong answers it recognises, each told by its own hint: one rounding of the exact mean ("rounded once");
    division after the sum ("divided by W after the sum"); no division ("W times the mean"); division before the
    cast ("divided before casting"); a hard-coded 2, right on two ranks only ("divided by 2"); the ranks added
    last first ("reverse order"); torch.sum over a stack ("one by one"); the sum in float32 ("summed in
    float32"); the dtype argument ignored ("use the dtype argument"); a 16-bit result ("casts the sum back to
    float32"); the wrong shape, a hard-coded tensor of another size say ("the gradient's shape"). Anything else,
    a hard-coded tensor of the right shape too, gets the general hint ("differs from the hook's").
    """
    return check_function(
        "simulate_compress",
        attempt,
        _verify_simulate,
        "Bit for bit the hook's arithmetic in float16 and bfloat16, on ordinary, cancelling, tiny and huge values, "
        "and on three ranks.",
    )

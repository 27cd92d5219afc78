"""Notebook 10's exercises: predict how 16-bit reduction error grows with the number of ranks, and
write the 16-bit-wire / float32-sum hook (checked against the reference on 4 real ranks, where a
plain bf16 all-reduce rounds differently and cannot pass)."""

from typing import Any

from ..hooks.low_precision import Wire16State, wire16_sum32_hook
from .checking import Outcome, check_function, check_prediction, choice_problem, reference, run_beside_reference

__all__ = ["bf16_state", "check_growth_prediction", "check_wire16_hook", "growth_answer"]

reference("wire16_sum32_hook")(wire16_sum32_hook)


def bf16_state(process_group: Any) -> Wire16State:
    """The state the exercise's hook gets on every rank: bfloat16 on the wire."""
    import torch

    return Wire16State(torch.bfloat16, process_group)


def growth_answer(table) -> str:
    """'grows' if the ring's bf16 error at the largest W is over 1.5x its error at the smallest, else 'flat'."""
    ring = table[table["dtype"] == "bfloat16"].set_index("world_size")["ring"]
    return "grows" if ring.iloc[-1] > 1.5 * ring.iloc[0] else "flat"


def fp16_state(process_group: Any) -> Wire16State:
    """The same with float16 on the wire: a hook that hard-codes bfloat16 fails it."""
    import torch

    return Wire16State(torch.float16, process_group)


def check_growth_prediction(prediction: Any, table) -> Outcome:
    """Prediction: does a bf16 ring all-reduce's error 'grow' or stay 'flat' from 2 to 16 ranks?

    A prediction with two choices has one wrong one; each gets its own hint (none says the answer):

    - "flat", where it grows ("one more rank, one more number: the mean stays as precise"): "what each extra hop
      adds";
    - "grows", where it is flat: "in this table".

    Malformed answers get a clear message instead: not a str, or a misspelt choice ("grow", "Grows").
    """
    answer = growth_answer(table)
    hint = (
        "compare the ring column at the smallest and the largest world size, and think of what each extra hop adds."
        if answer == "grows"
        else "in this table the ring column barely moves from the smallest to the largest world size: what could "
        "keep each extra hop's rounding from adding up?"
    )
    return check_prediction(
        "growth",
        prediction,
        answer,
        hint,
        "Every hop adds one more rounding of a partial sum; the bound grows like (W+1)u.",
        malformed=lambda attempt: choice_problem(attempt, ("grows", "flat")),
    )


def _float32_sum(rows, world: int, dtype):
    """The right step 3: sum the received rows in float32 and round once."""
    return rows.float().sum(dim=0).to(dtype)


def _sum_in_16_bits(rows, world: int, dtype):
    """A slip in step 3: one 16-bit rounding per addition (``tensor.sum`` would accumulate in float32)."""
    total = rows[0].clone()
    for row in rows[1:]:
        total += row
    return total


def scaffold(fill, total=_float32_sum, gather: bool = True):
    """Notebook 10's exercise cell as a hook, with the learner's steps as functions: ``fill(buffer, W)`` is what
    goes on the wire (cast to ``state.dtype`` as it is stored), ``total(rows, W, dtype)`` this rank's summed
    piece; ``gather=False`` keeps only this rank's own piece (a slip). The checker's slips and the tests' wrong
    answers are built from it, so that each is the scaffold with one step changed."""

    def hook(state, bucket):
        import torch
        import torch.distributed as dist

        from ..hooks.contract import completed_future

        group = state.process_group
        world = dist.get_world_size(group)
        buffer = bucket.buffer()
        piece = -(-buffer.numel() // world)  # ceil: W equal pieces, at most W-1 padding zeros
        wire = torch.zeros(world * piece, dtype=state.dtype)
        received = torch.empty_like(wire)
        wire[: buffer.numel()] = fill(buffer, world)
        dist.all_to_all_single(received, wire, group=group)
        summed = total(received.view(world, piece), world, state.dtype)
        gathered = torch.zeros_like(wire)
        if gather:
            dist.all_gather(list(gathered.view(world, piece).unbind()), summed, group=group)
        else:
            gathered.view(world, piece)[dist.get_rank(group)] = summed
        buffer.copy_(gathered[: buffer.numel()])
        return completed_future(buffer)

    return hook


_ROUNDING_SLIPS = {
    "sum_in_16_bits": (
        scaffold(lambda buffer, world: buffer / world, _sum_in_16_bits),
        "you add the received pieces in the 16-bit format, one rounding per addition: add the received pieces in "
        "float32 and round the sum once.",
    ),
    "divide_after": (
        scaffold(lambda buffer, world: buffer, lambda rows, world, dtype: (rows.float().sum(dim=0) / world).to(dtype)),
        "you divide by W after the sum: divide by W in float32 before the cast, so that each value is rounded to "
        "16 bits once, already scaled.",
    ),
    "no_divide": (
        scaffold(lambda buffer, world: buffer),
        "your result is the sum over ranks, W times the mean: divide the bucket by W before the cast.",
    ),
}


def _verify_wire16(fn, cluster, steps: int, state_factory=bf16_state) -> str | None:
    a, b = run_beside_reference(fn, wire16_sum32_hook, state_factory, steps, cluster, world_size=4)
    if (a["rank_spread"] != 0).any():
        return "the ranks disagree after your hook: every rank must end with the same summed pieces."
    if (a["payload_bytes"] != b["payload_bytes"]).any():
        mine, design = a["payload_bytes"].iloc[-1], b["payload_bytes"].iloc[-1]
        said = (
            "Yours hands more: is every piece in state.dtype, 2 bytes a value?"
            if mine > design
            else "Yours hands less: both collectives are needed, the all-to-all and the all-gather."
        )
        return (
            f"your hook hands {mine:.0f} B per step to collectives, the design "
            f"{design:.0f} B: one all-to-all of the whole bucket in state.dtype (padded to "
            f"W equal pieces), then one all-gather of your summed piece. {said}"
        )
    differs = (a["rel_error"] - b["rel_error"]).abs() > 1e-6 * b["rel_error"].abs()
    if differs.any():
        yours, design = a["rel_error"].iloc[0], b["rel_error"].iloc[0]
        own = _rounding_slip(a, cluster, steps, state_factory)
        return f"same bytes, other rounding (rel_error {yours:.4g} vs {design:.4g} at step 0): " + (
            own or "divide by W in float32 before the cast, and add the received pieces in float32."
        )
    return None


def _rounding_slip(mine, cluster, steps: int, state_factory) -> str | None:
    """Which of the usual slips rounds exactly as yours does, run beside it on the same data (None: none)."""
    from ..experiment import compare

    runs = compare(
        [{"hook": hook, "label": name} for name, (hook, _) in _ROUNDING_SLIPS.items()],
        state_factory=state_factory,
        steps=steps,
        cluster=cluster,
        world_size=4,
    )
    for run, (_, hint) in zip(runs, _ROUNDING_SLIPS.values()):
        slip = run.steps["rel_error"]
        if ((mine["rel_error"] - slip).abs() <= 1e-6 * slip.abs()).all():
            return hint
    return None


def _verify_both_formats(fn, cluster, steps: int) -> str | None:
    problem = _verify_wire16(fn, cluster, steps)
    if problem is None:
        try:
            problem = _verify_wire16(fn, cluster, steps, fp16_state)
        except Exception as exc:  # mixed 16-bit dtypes in one collective raise
            problem = f"your code raised {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}."
        if problem is not None:
            # bfloat16 hard-coded is right on the bfloat16 run only; a slip that W = 4 hides in bfloat16 (divide
            # after the sum: a power of two divides exactly) shows here too, so the hint says "if"
            problem = (
                f"with state.dtype = torch.float16, {problem} If your hook names a 16-bit format itself, "
                "use state.dtype instead."
            )
    return problem


def check_wire16_hook(attempt, cluster=None, steps: int = 2) -> Outcome:
    """Your hook and the reference on 4 ranks, bfloat16 on the wire and then float16: the same bytes, the same error.

    Wrong answers it recognises, each told by its own hint: a plain 16-bit all-reduce ("Yours hands less"); float32
    on the wire ("Yours hands more"); the sum in 16 bits ("add the received pieces in float32"); the division after
    the sum ("divide by W after the sum"); no division ("W times the mean"); bfloat16 hard-coded, right on the
    bfloat16 run only ("use state.dtype"); ranks that end apart ("the ranks disagree"); a hook that raises ("your
    code raised"). Another rounding gets the general hint ("same bytes, other rounding").
    """
    return check_function(
        "wire16_sum32_hook",
        attempt,
        lambda fn: _verify_both_formats(fn, cluster, steps),
        f"On 4 ranks it moves the reference's bytes and rounds exactly as it does, {steps} steps.",
    )

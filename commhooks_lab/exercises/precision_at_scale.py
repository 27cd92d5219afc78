"""Notebook 9's exercises: predict how 16-bit reduction error grows with the number of ranks, and
write the 16-bit-wire / float32-sum hook (checked against the reference on 4 real ranks, where a
plain bf16 all-reduce rounds differently and cannot pass)."""

from typing import Any

from ..hooks.low_precision import Wire16State, wire16_sum32_hook
from . import Outcome, check_function, check_prediction, reference, run_beside_reference

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


def check_growth_prediction(prediction: Any, table) -> Outcome:
    """Prediction: does a bf16 ring all-reduce's error 'grow' or stay 'flat' from 2 to 16 ranks?"""
    return check_prediction(
        "growth",
        prediction,
        growth_answer(table),
        "compare the ring column at the smallest and the largest world size, and think of what each extra hop adds.",
        "Every hop adds one more rounding of a partial sum; the bound grows like (W+1)u.",
    )


def _verify_wire16(fn, cluster, steps: int) -> str | None:
    a, b = run_beside_reference(fn, wire16_sum32_hook, bf16_state, steps, cluster, world_size=4)
    if (a["rank_spread"] != 0).any():
        return "the ranks disagree after your hook: every rank must end with the same summed pieces."
    if (a["payload_bytes"] != b["payload_bytes"]).any():
        return (
            f"your hook hands {a['payload_bytes'].iloc[-1]:.0f} B per step to collectives, the design "
            f"{b['payload_bytes'].iloc[-1]:.0f} B: one all-to-all of the whole bucket in state.dtype (padded to "
            "W equal pieces), then one all-gather of your summed piece."
        )
    differs = (a["rel_error"] - b["rel_error"]).abs() > 1e-6 * b["rel_error"].abs()
    if differs.any():
        yours, design = a["rel_error"].iloc[0], b["rel_error"].iloc[0]
        return (
            f"same bytes, other rounding (rel_error {yours:.4g} vs {design:.4g} at step 0): divide by W in "
            "float32 before the cast, and add the received pieces in float32."
        )
    return None


def check_wire16_hook(attempt, cluster=None, steps: int = 2) -> Outcome:
    """Your hook and the reference on 4 ranks: the same bytes, the same error."""
    return check_function(
        "wire16_sum32_hook",
        attempt,
        lambda fn: _verify_wire16(fn, cluster, steps),
        f"On 4 ranks it moves the reference's bytes and rounds exactly as it does, {steps} steps.",
    )

"""Notebook 8's exercises: the bytes a ring puts on each link, and when an all-gathered compressor
stops saving bytes as the world grows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from . import Outcome, check_function, check_prediction, reference

__all__ = ["check_crossing_prediction", "check_link_bytes", "crossing_world_size", "link_bytes", "nearest_choice"]

# -- exercise 1: bytes over each rank's link ---------------------------------------------------------------


@reference("link_bytes")
def link_bytes(allreduce_bytes: float, allgather_bytes: float, world_size: int) -> float:
    """Bytes over each rank's link in one step, with ring algorithms.

    A ring all-reduce is a reduce-scatter then an all-gather: each moves (W-1)/W of the tensor over
    every link. A ring all-gather hands each of the other W-1 payloads over every link once.
    """
    w = world_size
    return 2 * (w - 1) / w * allreduce_bytes + (w - 1) * allgather_bytes


#: (all-reduced bytes, all-gathered bytes, world size): each factor alone, then mixed
_CASES = ((1000, 0, 2), (1000, 0, 8), (0, 100, 2), (0, 100, 8), (4000, 250, 16), (0, 0, 4), (500, 50, 1))


def _verify_link_bytes(fn) -> str | None:
    for allreduced, gathered, w in _CASES:
        returned, want = fn(allreduced, gathered, w), link_bytes(allreduced, gathered, w)
        try:
            got = float(returned)  # a Python number, a NumPy scalar or a one-element tensor
        except (TypeError, ValueError):
            return f"link_bytes({allreduced}, {gathered}, {w}) returned {returned!r}: return a number of bytes."
        if not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9):
            call = f"link_bytes({allreduced}, {gathered}, {w}) returned {got!r}, which is not right."
            if gathered == 0:
                return (
                    f"{call} Look at the all-reduce term: a ring all-reduce is two passes (reduce-scatter, then "
                    "all-gather), and in each every rank sends W-1 of the tensor's W chunks."
                )
            if allreduced == 0:
                return (
                    f"{call} Look at the all-gather term: every rank must receive the payload of each *other* "
                    "rank, and in a ring each of them crosses every link once."
                )
            return f"{call} Each term alone is right: add them."
    return None


def check_link_bytes(attempt) -> Outcome:
    """``link_bytes(allreduce_bytes, allgather_bytes, world_size)`` against the reference on fixed cases."""
    return check_function(
        "link_bytes",
        attempt,
        _verify_link_bytes,
        "2(W-1)/W of what is all-reduced plus (W-1) times what is all-gathered, on every case.",
    )


# -- exercise 2: when does all-gathered top-k put more bytes on a link than fp16 all-reduce? ---------------

CROSSING_CHOICES = {"a": None, "b": 10, "c": 50, "d": 1000}  # None: never


def crossing_world_size(
    shapes: Sequence[tuple[int, ...]], gathered: tuple[str, dict], reduced: tuple[str, dict], max_world: int = 100_000
) -> int | None:
    """The smallest world size at which ``gathered`` puts more bytes on each link than ``reduced`` (rules of
    :mod:`commhooks_lab.studies.network`), or None if it never does up to ``max_world``."""
    from ..studies.network import link_bytes as ring_link_bytes
    from ..studies.network import rule_traffic

    a, b = rule_traffic(shapes, gathered[0], **gathered[1]), rule_traffic(shapes, reduced[0], **reduced[1])
    lo, hi = 2, max_world
    if ring_link_bytes(a, hi) <= ring_link_bytes(b, hi):
        return None
    while lo < hi:  # the ratio grows with W: (W-1) / (2(W-1)/W) = W/2
        mid = (lo + hi) // 2
        if ring_link_bytes(a, mid) > ring_link_bytes(b, mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def nearest_choice(world_size: int | None) -> str:
    """The choice whose world size is nearest on a log scale (or "a", never)."""
    if world_size is None:
        return "a"
    sizes = {k: v for k, v in CROSSING_CHOICES.items() if v is not None}
    return min(sizes, key=lambda k: abs(math.log(world_size / sizes[k])))


def check_crossing_prediction(prediction: Any, shapes: Sequence[tuple[int, ...]]) -> Outcome:
    """Prediction "a"-"d": from how many ranks on top-k 1% (all-gathered) puts more bytes on a link than fp16."""
    crossing = crossing_world_size(shapes, ("topk", {"ratio": 0.01}), ("fp16", {}))
    answer = nearest_choice(crossing)
    if prediction is not None and prediction not in CROSSING_CHOICES:
        prediction = f"{prediction!r}, not one of {sorted(CROSSING_CHOICES)}"
    return check_prediction(
        "crossing_prediction",
        prediction,
        answer,
        "Write both per-link byte counts for N gradient elements: top-k sends 1% of them at 8 bytes each, "
        "(W-1) times; fp16 sends 2 bytes each, 2(W-1)/W times. Where is their ratio 1?",
        f"top-k's (W-1) x 0.08 N bytes exceed fp16's 2(W-1)/W x 2 N from W = {crossing} on: the ratio is W/50.",
    )

"""Notebook 8's exercises: below which payload a ring all-reduce is latency-bound in the alpha-beta model,
and when an all-gathered compressor stops saving bytes as the world grows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .checking import Outcome, check_function, check_prediction, choice_problem, reference

__all__ = [
    "allreduce_seconds",
    "check_allreduce_seconds",
    "check_crossing_prediction",
    "check_latency_bound_bytes",
    "crossing_world_size",
    "latency_bound_bytes",
    "nearest_choice",
]

# -- exercise 1: below which payload is a ring all-reduce latency-bound? ------------------------------------


@reference("latency_bound_bytes")
def latency_bound_bytes(world_size: int, latency_us: float, bandwidth_gbps: float) -> float:
    """The payload n* (bytes) of one ring all-reduce whose latency and bandwidth terms are equal.

    2(W-1) ring steps of alpha each, against 2(W-1)/W of the n bytes over each link at beta bytes per second:
    2(W-1) alpha = 2(W-1)/W n / beta, so n* = W alpha beta.
    """
    alpha = latency_us * 1e-6  # seconds
    beta = bandwidth_gbps * 1e9 / 8  # bytes per second
    return world_size * alpha * beta


#: (world size, latency in microseconds, bandwidth in Gbit/s): powers of two and others, small and large
_LATENCY_CASES = ((2, 5.0, 10.0), (3, 5.0, 10.0), (8, 5.0, 10.0), (8, 5.0, 100.0), (12, 2.0, 25.0), (1000, 50.0, 400.0))


def _model_crossing(world_size: int, latency_us: float, bandwidth_gbps: float) -> float:
    """n* read off the lab's network model: its latency term for one all-reduce over its bandwidth term per byte."""
    from ..studies.network import comm_seconds

    def one_allreduce(n: float) -> dict:
        return {"allreduce_bytes": n, "allgather_bytes": 0.0, "allreduce_calls": 1, "allgather_calls": 0}

    latency_term = comm_seconds(one_allreduce(0.0), world_size, bandwidth_gbps, latency_us)
    seconds_per_byte = comm_seconds(one_allreduce(1.0), world_size, bandwidth_gbps, 0.0)
    return latency_term / seconds_per_byte


def _ratio_hint(ratios: list[tuple[int, float]]) -> str | None:
    """The mistake that turns the right n* into yours, told by how far off it is at each world size."""

    def everywhere(factor) -> bool:
        return all(math.isclose(r, factor(w), rel_tol=1e-6) for w, r in ratios)

    first = ratios[0][1]
    if all(math.isclose(r, first, rel_tol=1e-6) for _, r in ratios):  # the same factor at every W: units
        units = [
            (a, b) for a in (-1, 0, 1) for b in range(-4, 5) if math.isclose(first, 8.0**a * 1000.0**b, rel_tol=1e-6)
        ]
        if units and units[0] != (0, 0):
            bits, thousands = units[0]
            said = []
            if bits:
                said.append("bandwidth_gbps counts gigabits per second, and n* is in bytes")
            if thousands:
                said.append("latency_us is in microseconds (1e-6 s) and bandwidth_gbps in 1e9 bits per second")
            return f"it is off by the same factor at every W, a matter of units: {'; '.join(said)}."
    if everywhere(lambda w: 1 / w):
        return (
            "it is W times too small: it is where one message's alpha equals n / beta. A ring all-reduce pays the "
            "latency once per ring step, and over each link it moves only part of the payload: count both."
        )
    if everywhere(lambda w: (w - 1) / w):
        return (
            "it is right for many ranks and too small for few (half at W = 2): the bytes over each link approach "
            "twice the payload as W grows, but are not twice it. How many chunks of W does each pass move?"
        )
    if everywhere(lambda w: w / (w - 1)):
        return (
            "it is right for many ranks and too large for few (twice at W = 2): count the ring steps again. In each "
            "pass a chunk has to reach the other ranks, not every rank."
        )
    if everywhere(lambda w: 0.5):
        return (
            "it is half as large as it should be at every W: a ring all-reduce is two passes, a reduce-scatter and "
            "an all-gather, and both pay the latency at each of their steps."
        )
    if everywhere(lambda w: 2.0):
        return (
            "it is twice as large as it should be at every W: both passes, the reduce-scatter and the all-gather, "
            "move their share of the payload over each link."
        )
    return None


def _verify_latency_bound_bytes(fn) -> str | None:
    ratios: list[tuple[int, float]] = []
    for w, latency_us, bandwidth_gbps in _LATENCY_CASES:
        returned = fn(w, latency_us, bandwidth_gbps)
        call = f"latency_bound_bytes({w}, {latency_us}, {bandwidth_gbps})"
        try:
            got = float(returned)  # a Python number, a NumPy scalar or a one-element tensor
        except (TypeError, ValueError):
            return f"{call} returned {returned!r}: return a number of bytes."
        ratios.append((w, got / _model_crossing(w, latency_us, bandwidth_gbps)))
    if all(math.isclose(r, 1.0, rel_tol=1e-9) for _, r in ratios):
        return None
    hint = _ratio_hint(ratios)
    if hint:
        return hint
    returned_values = {float(fn(*case)) for case in _LATENCY_CASES}
    if len(returned_values) == 1:
        return (
            f"your function returns {returned_values.pop():.6g} B for every case: n* depends on the world size, the "
            "latency and the bandwidth, so compute it from them."
        )
    right = [case for case, (_, r) in zip(_LATENCY_CASES, ratios) if math.isclose(r, 1.0, rel_tol=1e-9)]
    if right:
        wrong = next(case for case, (_, r) in zip(_LATENCY_CASES, ratios) if not math.isclose(r, 1.0, rel_tol=1e-9))
        return (
            f"right on latency_bound_bytes{right[0]} but not on latency_bound_bytes{wrong}: a number fixed in your "
            "code that should come from an argument? Use world_size, latency_us and bandwidth_gbps as given."
        )
    w, latency_us, bandwidth_gbps = _LATENCY_CASES[2]
    got = float(fn(w, latency_us, bandwidth_gbps))
    t = {"allreduce_bytes": got, "allgather_bytes": 0.0, "allreduce_calls": 1, "allgather_calls": 0}
    from ..studies.network import comm_seconds

    latency_term = comm_seconds(t, w, math.inf, latency_us)
    bandwidth_term = comm_seconds(t, w, bandwidth_gbps, 0.0)
    return (
        f"latency_bound_bytes({w}, {latency_us}, {bandwidth_gbps}) returned {got:.6g} B. An all-reduce of that size "
        f"has, in the lab's model, a latency term of {1e6 * latency_term:.4g} us and a bandwidth term of "
        f"{1e6 * bandwidth_term:.4g} us: write both terms for n bytes and set them equal."
    )


def check_latency_bound_bytes(attempt) -> Outcome:
    """``latency_bound_bytes(world_size, latency_us, bandwidth_gbps)`` against the lab's network model, on six
    cases (world sizes 2 to 1000, powers of two and others).

    Wrong answers it recognises, each told by its own hint: one message's alpha = n / beta ("W times too small");
    bytes per link taken as twice the payload ("too small for few"); 2W ring steps ("count the ring steps
    again"); one pass's latency ("both pay the latency"); one pass's bytes ("both passes ... move"); bits for
    bytes ("counts gigabits per second"); microseconds as milliseconds ("latency_us is in microseconds"); a
    hard-coded number, right at 8 ranks only ("for every case"); a hard-coded latency or bandwidth, right on the
    cases that use it only ("but not on"). Anything else gets the general hint ("write both terms for n bytes and
    set them equal").
    """
    return check_function(
        "latency_bound_bytes",
        attempt,
        _verify_latency_bound_bytes,
        "n* = W x alpha x beta (beta in bytes per second), from 2(W-1) alpha = 2(W-1)/W x n / beta, as the lab's "
        "network model has it at every world size. It grows with W: the ring pays the latency 2(W-1) times but "
        "moves only 2(W-1)/W of the payload over each link. At 8 ranks, 5 us and 10 Gbit/s n* is 50,000 B, more "
        "than the digits CNN's 39,720-byte fp32 all-reduce: its latency term is the larger one.",
    )


# -- exercise 1b: the time itself, where a reduce-scatter alone no longer gives the right answer -------------


@reference("allreduce_seconds")
def allreduce_seconds(world_size: int, latency_us: float, bandwidth_gbps: float, payload_bytes: float) -> float:
    """One ring all-reduce of ``payload_bytes`` in the alpha-beta model: 2(W-1) alpha + 2(W-1)/W n / beta."""
    steps = 2 * (world_size - 1)
    return steps * latency_us * 1e-6 + steps / world_size * payload_bytes * 8 / (bandwidth_gbps * 1e9)


#: (world size, latency in microseconds, bandwidth in Gbit/s, payload in bytes)
_TIME_CASES = tuple((w, a, b, n) for w, a, b in _LATENCY_CASES for n in (0.0, 39_720.0, 4.5e6))


def _time_slips() -> list[tuple[str, Any]]:
    """Plausible wrong models, each with the hint that names its mistake (all give the right n* of part a but the
    first two, so part a cannot tell them from the right one)."""

    def bits(w, a, b, n):
        return 2 * (w - 1) * a * 1e-6 + 2 * (w - 1) / w * n / (b * 1e9)

    return [
        (
            "that is a reduce-scatter alone, half of an all-reduce: a ring all-reduce is a reduce-scatter and then "
            "an all-gather, and both pay W-1 latencies and move (W-1)/W of the payload over each link.",
            lambda w, a, b, n: (w - 1) * a * 1e-6 + (w - 1) / w * n * 8 / (b * 1e9),
        ),
        (
            "that is one message, alpha + n / beta: a ring takes 2(W-1) steps, each paying alpha and moving one "
            "chunk of n / W over each link.",
            lambda w, a, b, n: a * 1e-6 + n * 8 / (b * 1e9),
        ),
        (
            "each ring step moves one chunk, n / W, not the whole payload: the bytes over each link are 2(W-1)/W n.",
            lambda w, a, b, n: 2 * (w - 1) * (a * 1e-6 + n * 8 / (b * 1e9)),
        ),
        (
            "the latency is paid once here: the ring pays alpha at each of its 2(W-1) steps.",
            lambda w, a, b, n: a * 1e-6 + 2 * (w - 1) / w * n * 8 / (b * 1e9),
        ),
        ("bandwidth_gbps counts bits, and the payload is in bytes: 8 bits to a byte.", bits),
        (
            "latency_us is in microseconds: 1e-6 s each.",
            lambda w, a, b, n: 2 * (w - 1) * a + 2 * (w - 1) / w * n * 8 / (b * 1e9),
        ),
    ]


def _verify_allreduce_seconds(fn) -> str | None:
    got = []
    for case in _TIME_CASES:
        returned = fn(*case)
        try:
            got.append(float(returned))
        except (TypeError, ValueError):
            return f"allreduce_seconds{case} returned {returned!r}: return a number of seconds."

    def matches(model) -> bool:
        return all(math.isclose(g, model(*case), rel_tol=1e-9, abs_tol=1e-15) for g, case in zip(got, _TIME_CASES))

    if matches(allreduce_seconds):
        return None
    for hint, slip in _time_slips():
        if matches(slip):
            return hint
    if len(set(got)) == 1:
        return (
            f"your function returns {got[0]:.6g} s for every world size, latency, bandwidth and payload: compute the "
            "time from its four arguments."
        )
    if matches(lambda w, a, b, n: 2 * (w - 1) * a * 1e-6):
        return "that is the latency term alone: the payload takes time too, its bytes over each link at beta."
    if matches(lambda w, a, b, n: 2 * (w - 1) / w * n * 8 / (b * 1e9)):
        return "that is the bandwidth term alone: each of the ring's steps also pays the latency alpha."
    w, a, b, n = _TIME_CASES[-4]
    return (
        f"allreduce_seconds({w}, {a}, {b}, {n:g}) returned {float(fn(w, a, b, n)):.6g} s, the lab's model "
        f"{allreduce_seconds(w, a, b, n):.6g} s: write the latency term and the bandwidth term and add them."
    )


def check_allreduce_seconds(attempt) -> Outcome:
    """``allreduce_seconds(world_size, latency_us, bandwidth_gbps, payload_bytes)`` against the alpha-beta model.

    Wrong answers it recognises, each told by its own hint: a reduce-scatter alone, which has part a's right n*
    ("a reduce-scatter alone"); one message ("that is one message"); the whole payload at every ring step ("each
    ring step moves one chunk"); the latency paid once ("the latency is paid once"); bits for bytes ("counts
    bits"); microseconds for seconds ("latency_us is in microseconds"); a hard-coded number ("for every world
    size"); the latency term alone ("the latency term alone"); the bandwidth term alone ("the bandwidth term
    alone"). Anything else gets the general hint ("write the latency term and the bandwidth term").
    """
    return check_function(
        "allreduce_seconds",
        attempt,
        _verify_allreduce_seconds,
        "2(W-1) alpha + 2(W-1)/W x n / beta: two passes (reduce-scatter, all-gather), each of W-1 steps that pay "
        "alpha and move n / W over each link. A reduce-scatter alone takes half of it and has the same n*.",
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
    """Prediction "a"-"d": from how many ranks on top-k 1% (all-gathered) puts more bytes on a link than fp16.

    A prediction with four choices has three wrong ones; each gets its own hint (none says the answer):

    - "a", never: "grow with W";
    - "b", about 10: the general hint, "Where is their ratio 1?";
    - "d", about 1000: "a value and its index".

    Malformed answers get a clear message instead: not a str (the world size itself, 50, say), or not one of the
    four letters ("never", "C").
    """
    crossing = crossing_world_size(shapes, ("topk", {"ratio": 0.01}), ("fp16", {}))
    answer = nearest_choice(crossing)
    general = (
        "Write both per-link byte counts for N gradient elements: top-k sends 1% of them at 8 bytes each, "
        "(W-1) times; fp16 sends 2 bytes each, 2(W-1)/W times. Where is their ratio 1?"
    )
    slips = [
        (
            "a",
            "An all-gather's bytes over each link grow with W (every rank receives every other rank's part), an "
            f"all-reduce's stay below twice the payload: can the first stay below the second for ever? {general}",
        ),
        (
            "d",
            f"Count every byte top-k sends per kept entry, a value and its index, against fp16's 2 bytes per "
            f"element. {general}",
        ),
    ]
    return check_prediction(
        "crossing_prediction",
        prediction,
        answer,
        general,
        f"top-k's (W-1) x 0.08 N bytes exceed fp16's 2(W-1)/W x 2 N from W = {crossing} on: the ratio is W/50.",
        slips=slips,
        malformed=lambda attempt: choice_problem(attempt, sorted(CROSSING_CHOICES)),
    )

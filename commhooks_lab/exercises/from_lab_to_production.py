"""Notebook 13's exercise: how much of one backward's communication did autograd's compute hide?

The check runs the learner's function on hand-made backwards whose answers tell the usual slips
apart (counting two buckets' simultaneous communication twice, counting time inside a blocking
hook call as compute, counting communication after the last gradient as hidden, dividing by the
backward time, merging buckets in the order they are listed, ending a merged interval at a short bucket's end)
and on a real timeline. The function reads one rank's times: no world size enters it, so it runs in the notebook's
process (the timeline it is held to was measured at 2 ranks)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..studies.overlap import computing_spans, hidden_share, merged_intervals, overlap_length, total_length
from .checking import NOTHING_LATER, Outcome, check_function, reference

__all__ = ["CASES", "check_hidden_share"]

reference("hidden_share")(hidden_share)

Buckets = Sequence[tuple[float, float, float]]

#: (ready, returned, done) per bucket: an async hook, a blocking one, two buckets at once, and buckets listed out of
#: order (a measured backward's rows need not come sorted by ready) with a short one sent inside a longer one.
CASES: dict[str, list[tuple[float, float, float]]] = {
    "two async buckets, the second still sending after the last gradient": [(1.0, 1.1, 3.0), (4.0, 4.1, 6.0)],
    "a blocking hook: every bucket sent inside its call": [(1.0, 2.0, 2.0), (3.0, 4.5, 4.5), (5.0, 5.5, 5.5)],
    "three buckets sending at once, one hook call that waits": [(0.5, 0.6, 4.0), (1.0, 2.0, 3.5), (3.0, 3.1, 5.0)],
    "four buckets listed out of order, a short one sent inside a longer one": [
        (2.5, 2.6, 3.0),
        (0.5, 0.7, 2.0),
        (1.0, 1.2, 1.5),
        (3.0, 3.1, 4.5),
    ],
}
_UNSORTED = (
    "the buckets come in any order (a measured backward's rows are not sorted by ready time): sort the intervals by "
    "their start before you merge them."
)


def _merged_to_the_last_end(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A slip: an interval that overlaps the one before it ends the merged one at its own end, even when shorter."""
    merged: list[tuple[float, float]] = []
    for start, stop in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return merged


def _share_merged_so(buckets: Buckets, merge: Callable) -> float:
    """:func:`hidden_share` with its merges done by ``merge``."""
    comm = merge([(r, d) for r, _, d in buckets])
    end = max(r for r, _, _ in buckets)
    computing, at = [], 0.0
    for a, b in merge([(r, min(t, end)) for r, t, _ in buckets if r < end]):
        computing.append((at, a))
        at = b
    return overlap_length(comm, [*computing, (at, end)]) / total_length(comm)


def _slips(buckets: Buckets) -> dict[str, float]:
    """What the usual wrong algorithms give, with the hint for each."""
    comm = merged_intervals([(r, d) for r, _, d in buckets])
    computing = computing_spans(buckets)
    last_ready, last_done = max(r for r, _, _ in buckets), max(d for _, _, d in buckets)
    return {
        "buckets that communicate at the same time count once: merge the intervals before you add them up.": sum(
            overlap_length([(r, d)], computing) for r, _, d in buckets
        )
        / sum(d - r for r, _, d in buckets),
        "while the backward thread is inside a hook call, autograd is not computing: cut those spans out.": (
            overlap_length(comm, [(0.0, last_ready)]) / total_length(comm)
        ),
        "autograd computes only until the last bucket is ready; what is sent after that is exposed.": (
            overlap_length(comm, [(0.0, last_done)]) / total_length(comm)
        ),
        "divide by the communication time, not by the backward time.": overlap_length(comm, computing) / last_done,
        "a short bucket sent inside a longer one's time must not cut the merged interval short: end it at the later "
        "of the two ends, max(end, stop).": _share_merged_so(buckets, _merged_to_the_last_end),
    }


def _verify(fn: Callable[[Buckets], float], timeline_cases: dict[str, Buckets]) -> str | None:
    hand = {name: float(fn(list(buckets))) for name, buckets in CASES.items()}

    def fits(hint: str) -> bool:  # the slip gives the learner's number on every hand-made backward
        return all(abs(hand[name] - _slips(buckets)[hint]) <= 1e-9 for name, buckets in CASES.items())

    for name, buckets in {**CASES, **timeline_cases}.items():
        got, want = hand[name] if name in hand else float(fn(list(buckets))), hidden_share(buckets)
        if abs(got - want) <= 1e-9:
            continue
        in_order = sorted(buckets)
        if in_order != list(buckets) and abs(float(fn(in_order)) - want) <= 1e-9:
            return f"for {name!r} you get {got:.4f}, and {want:.4f} with the same buckets sorted by ready: {_UNSORTED}"
        for hint, slip in _slips(buckets).items():
            if abs(got - slip) <= 1e-9 and abs(slip - want) > 1e-9 and fits(hint):
                return f"for {name!r} you get {got:.4f}: {hint}"
        if abs(got - 100 * want) <= 1e-7:
            return f"for {name!r} you get {got:.4f}: return a share between 0 and 1, not a percentage."
        if len(set(hand.values())) == 1:
            return (
                f"you get {got:.4f} for every hand-made backward, whatever its buckets: compute the share from the "
                "(ready, returned, done) times you are given."
            )
        if name not in CASES:
            return (
                f"right on the hand-made backwards, but for {name!r} you get {got:.4f}, the reference {want:.4f}: "
                "a measured backward has buckets whose times interleave in other ways (sort by ready, merge what "
                "overlaps)."
            )
        drawn = ", ".join(f"({r:.4f}, {t:.4f}, {d:.4f})" for r, t, d in sorted(buckets))
        return (
            f"for {name!r} you get {got:.4f}, the reference {want:.4f}; draw its intervals on a line (sorted by "
            f"ready: {drawn}) and shade what overlaps compute."
        )
    return None


def check_hidden_share(attempt, timeline=None) -> Outcome:
    """Your hidden_share on hand-made backwards and on rank 0's backwards of ``timeline``.

    Wrong answers it recognises, each told by its own hint: overlapping buckets counted twice ("merge the
    intervals"); time inside a blocking hook call counted as compute ("inside a hook call"); communication after
    the last gradient counted as hidden ("what is sent after that is exposed"); a division by the backward time
    ("divide by the communication time"); intervals merged in the order they are listed ("sort the intervals by
    their start"); a merged interval ended at a shorter bucket's end ("max(end, stop)"); a percentage ("not a
    percentage"); an answer right on the hand-made backwards only ("right on the hand-made backwards"); a
    hard-coded number ("for every hand-made backward"). Anything else gets the general hint ("draw its intervals on
    a line").
    """
    real: dict[str, Buckets] = {}
    if timeline is not None:
        for (hook, repeat), rows in timeline[timeline["rank"] == 0].groupby(["hook", "repeat"]):
            if repeat == 0:
                real[f"{hook}, measured"] = list(zip(rows["ready"], rows["returned"], rows["done"]))
    return check_function(
        "hidden_share",
        attempt,
        lambda fn: _verify(fn, real),
        f"It agrees with the reference on {len(CASES)} hand-made backwards and {len(real)} measured ones.",
        later=NOTHING_LATER,
    )

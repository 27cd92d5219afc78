"""Notebook 15's exercise: an entry of your own in the hook challenge, one that beats fp16's score.

The check runs the learner's hook through the lab's probe for a few steps of the digits CNN at 2, 3 and 4 ranks,
then scores it on the challenge's task set (2 ranks). Wrong answers it tells apart, each by its own hint: the ranks
left holding different gradients (each rank decoding only its own share, or no collective at all); a step-0 average
in the exact direction at the wrong scale (the sum, or a division by 2 where the world size belongs: right at 2
ranks only); a step-0 gradient no nearer the average than zeros are; a disqualified entry (its reason); an entry
that scores no higher than fp16 (as many bytes, or the accuracy it saved lost).

No ``from __future__ import annotations`` here: DDP compares a hook's return annotation with
``torch.futures.Future[torch.Tensor]`` itself, and a string annotation would fail that check.
"""

import inspect
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..challenge.score import Score, score
from .checking import RIGHT, WORLD_SIZES, Outcome, check_function, first_problem_by_world_size, listed, reference

__all__ = ["Entry", "check_challenge_entry", "entry_hook", "entry_state", "write_entry"]

#: The digits CNN's first steps: short, and three buckets after DDP's rebuild.
PROBE_STEPS = 3
#: A step-0 average this close in direction to the exact one is the exact average, possibly scaled.
SAME_DIRECTION = 0.999
#: ... and one that far from it in size is scaled wrongly (fp16's own rounding is about 1e-4 of it).
WRONG_SIZE = 0.01


@reference("challenge_entry")
def entry_hook(state: dict, bucket) -> torch.futures.Future[torch.Tensor]:
    """Top-k of the whole bucket's (gradient + residual), each entry sent as a float16 value and an int32 index
    (6 bytes, where notebook 7's float32 values and int64 indices take 12). The residuals are kept per parameter
    (DDP rebuilds its buckets after step 0)."""
    world = dist.get_world_size()
    grad = bucket.buffer()
    params = bucket.parameters()
    corrected = grad + torch.cat([state["residuals"].get(p, torch.zeros(p.numel())) for p in params])
    k = max(1, int(state["ratio"] * grad.numel()))
    indices = corrected.abs().topk(k).indices.to(torch.int32)
    values = corrected[indices].to(torch.float16)
    sent = torch.zeros_like(corrected)
    sent[indices] = values.to(corrected.dtype)
    state["residuals"].update(zip(params, (corrected - sent).split([p.numel() for p in params])))
    all_values = [torch.empty_like(values) for _ in range(world)]
    all_indices = [torch.empty_like(indices) for _ in range(world)]
    dist.all_gather(all_values, values)
    dist.all_gather(all_indices, indices)
    grad.zero_()
    for v, i in zip(all_values, all_indices):
        grad.index_add_(0, i.long(), v.to(grad.dtype))
    grad.div_(world)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(grad)
    return future


def entry_state(process_group) -> dict:
    """The reference entry's state on every rank: 1% of each bucket, and its residuals."""
    return {"ratio": 0.01, "residuals": {}}


@dataclass(frozen=True)
class Entry:
    """An entry: its hook, its state's factory (or None) and its score."""

    hook: Callable
    make_state: Callable | None
    score: Score

    def __repr__(self) -> str:
        return self.score.report()


def _step0_problem(steps) -> str | None:
    first = steps.iloc[0]
    if (steps["rank_spread"] != 0).any():
        worst = steps.loc[steps["rank_spread"].idxmax()]
        return (
            f"after your hook the ranks hold different gradients (rank_spread {worst['rank_spread']:.3g} at step "
            f"{int(worst['step'])}): every rank must decode the same thing, from what every rank sent (all-gather or "
            "all-reduce it), not its own share alone."
        )
    if first["cosine"] > SAME_DIRECTION and first["rel_error"] > WRONG_SIZE:
        return (
            f"at step 0 your gradient points exactly along the average's (cosine {first['cosine']:.4f}) but is off "
            f"by {first['rel_error']:.0%} of its size: the scale is wrong. Divide the sum by dist.get_world_size()."
        )
    if not first["rel_error"] < 1:
        return (
            f"at step 0 your gradient is {first['rel_error']:.3g} of the average's size away from it: no nearer than "
            "zeros would be. Send the gradient's largest parts, and divide the sum by dist.get_world_size()."
        )
    return None


def _probe_problem(hook: Callable, make_state: Callable | None, ranks) -> str | None:
    from ..experiment import run

    result = run(
        hook=hook, state_factory=make_state, model="cnn", steps=PROBE_STEPS, eval_every=0, cluster=ranks,
        world_size=ranks.world_size,
    )  # fmt: skip
    return _step0_problem(result.steps)


def _fp16_score(baselines: Sequence[Score]) -> float:
    for entry in baselines:
        if entry.label == "fp16" and entry.value is not None:
            return entry.value
    raise ValueError("the baselines hold no fp16 score: pass lab.challenge.baselines()")


def check_challenge_entry(
    attempt: Any,
    make_state: Callable | None,
    baselines: Sequence[Score],
    cluster: Any = None,
    world_sizes: Sequence[int] = WORLD_SIZES,
) -> Outcome:
    """Your ``hook(state, bucket)`` (and ``make_state(process_group)``, or None) on the probe at 2, 3 and 4 ranks,
    then scored; right when it keeps DDP's invariant, averages at the right scale and scores above fp16's entry
    in ``baselines``. ``cluster``: a Cluster, or several, for the sizes they have (the score runs on the 2-rank
    one). The outcome's value is your :class:`Entry` when right, else the reference entry."""
    fp16 = _fp16_score(baselines)
    two = _of_size(cluster, 2)
    scored: dict[str, Score] = {}

    def verify(fn: Callable) -> str | None:
        problem = first_problem_by_world_size(lambda ranks: _probe_problem(fn, make_state, ranks), cluster, world_sizes)
        if problem is not None:
            return problem
        entry = scored["entry"] = score(fn, state_factory=make_state, label="your entry", cluster=two)
        if entry.value is None:
            return f"the challenge disqualified it: {entry.disqualified}"
        if entry.value <= fp16:
            return (
                f"it scores {entry.value:.2f}, fp16 {fp16:.2f}: {_below_fp16(entry)} Print the outcome's score for "
                "its parts."
            )
        return None

    outcome = check_function(
        "challenge_entry",
        attempt,
        verify,
        f"The ranks agree at {listed(world_sizes)} ranks, and your entry beats fp16's {fp16:.2f}.",
        later="The rest of the notebook uses the reference entry, a top-k with error feedback in float16.",
    )
    if outcome.status == RIGHT:
        outcome.value = Entry(attempt, make_state, scored["entry"])
    else:
        reference_score = score(entry_hook, state_factory=entry_state, label="the reference entry", cluster=two)
        outcome.value = Entry(entry_hook, entry_state, reference_score)
    return outcome


def _below_fp16(entry: Score) -> str:
    speeds = [t["speed"] for t in entry.tasks]
    if min(speeds) <= 4 / 3:
        return (
            "fp16 halves all-reduce's bytes (speed 4/3 on the wide MLP); yours sends at least as many. Send fewer "
            "numbers, or smaller ones."
        )
    return (
        "it sends less than fp16, but its accuracy fell further than that saves: keep what it drops (error feedback)."
    )


def _of_size(cluster: Any, world: int) -> Any:
    for each in cluster if isinstance(cluster, list | tuple) else [cluster]:
        if each is not None and each.world_size == world:
            return each
    return None


def write_entry(entry: Entry, folder: str | Path, name: str = "my_entry") -> Path:
    """``entry`` as a submission file, ``folder/name.py``: the source of its hook and state factory with the
    imports a hook needs, named as the leaderboard looks for them. What you would hand in."""
    from ..safe_files import Folder

    parts = ["import torch\nimport torch.distributed as dist"]
    for fn, as_name in ((entry.hook, "hook"), (entry.make_state, "make_state")):
        if fn is None:
            continue
        source = textwrap.dedent(inspect.getsource(fn)).rstrip().splitlines()
        parts.append("\n".join(source[_first_def(source) :]))  # without its decorators (the course's @reference)
        if fn.__name__ != as_name:
            parts.append(f"{as_name} = {fn.__name__}")
    with Folder.open(Path(folder), "give a folder you can write your entry to", create=True) as where:
        where.write(f"{name}.py", ("\n\n\n".join(parts) + "\n").encode())
    return Path(folder) / f"{name}.py"


def _first_def(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith("def "))

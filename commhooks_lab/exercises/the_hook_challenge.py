"""Notebook 15's exercise: an entry of your own in the hook challenge, one that beats every baseline.

The check reads the entry as the leaderboard will (the screen, and the names its two functions use), runs it at 2,
3 and 4 ranks (its scale on one hand-made bucket that every rank holds the same, then three steps of the digits CNN
through the lab's probe), then scores it on the challenge's task set (2 ranks). Wrong answers it tells apart, each
by its own hint: a refused import or a helper left outside the two functions; the ranks left holding different
gradients (each rank decoding only its own share, or no collective at all); a scale that is not the average's (the
sum, or a division by 2 where the world size belongs: right at 2 ranks only), dense or sparse; zeros; a
disqualified entry (its reason); one that sends as many bytes as fp16, or loses more accuracy than its bytes earn.

No ``from __future__ import annotations`` here: DDP compares a hook's return annotation with
``torch.futures.Future[torch.Tensor]`` itself, and a string annotation would fail that check.
"""

import builtins
import dis
import inspect
import math
import textwrap
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..challenge.score import Score, score, worst_rank_spread
from ..challenge.screen import screen
from .checking import (
    RIGHT,
    WORLD_SIZES,
    Outcome,
    check_function,
    clusters_by_size,
    first_problem_by_world_size,
    listed,
    reference,
)

__all__ = ["Entry", "check_challenge_entry", "entry_hook", "entry_source", "entry_state", "write_entry"]

#: The digits CNN's first steps: short, with DDP's bucket rebuild after step 0.
PROBE_STEPS = 3


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


#: Parameter sizes of the hand-made bucket the scale probe hands your hook: a matrix, a larger one and a bias.
_PROBE_SIZES = (1000, 4000, 10)
#: What a well-scaled entry's least-squares scale <h, g> / <h, h> is within, when every rank holds the same g: 1 for
#: the exact average and for every compressor that keeps part of g exactly (top-k, fp16's rounding, PowerSGD's
#: projection, sign x mean |g|); the sum gives 1/W, a division by 2 gives 2/W.
SCALE_RANGE = (0.9, 1.1)


class _Bucket:
    """What a hook calls on DDP's GradBucket, over a buffer this check made."""

    def __init__(self, buffer: torch.Tensor, parameters: list[torch.nn.Parameter]):
        self._buffer, self._parameters = buffer, parameters

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer = tensor

    def parameters(self) -> list[torch.nn.Parameter]:
        return self._parameters

    def gradients(self) -> list[torch.Tensor]:
        return list(self._buffer.split([p.numel() for p in self._parameters]))

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True


def _rank_scale(ctx, hook: Callable, make_state: Callable | None) -> dict:
    """On every rank: the same heavy-tailed gradient g, your hook on it, and how its result h scales against g."""
    generator = torch.Generator().manual_seed(0)
    total = sum(_PROBE_SIZES)
    same = torch.randn(total, generator=generator) * torch.randn(total, generator=generator).exp()
    parameters = [torch.nn.Parameter(torch.zeros(n)) for n in _PROBE_SIZES]
    state = make_state(dist.group.WORLD) if make_state is not None else None
    value = hook(state, _Bucket(same.clone(), parameters)).wait()
    h = (value[0] if isinstance(value, list | tuple) else value).double().reshape(-1)
    g = same.double()
    hh = float(h @ h)
    return {"scale": float(h @ g) / hh if hh > 0 else math.nan, "bytes": h.numpy().tobytes()}


def _scale_problem(hook: Callable, make_state: Callable | None, ranks) -> str | None:
    seen = ranks.run(_rank_scale, hook, make_state)
    if len({r["bytes"] for r in seen}) > 1:
        return _DISAGREE
    scale = seen[0]["scale"]
    if math.isnan(scale):
        return "given the same gradient on every rank, your hook returns zeros: send the gradient's largest parts."
    low, high = SCALE_RANGE
    if not low <= scale <= high:
        return (
            f"given the same gradient g on every rank, your hook's result h has the scale <h, g> / <h, h> = "
            f"{scale:.3g}, not 1 (1/{ranks.world_size} = {1 / ranks.world_size:.3g} is the sum's): average, "
            "dividing the sum by dist.get_world_size()."
        )
    return None


_DISAGREE = (
    "after your hook the ranks hold different gradients: every rank must decode the same thing, from what every "
    "rank sent (all-gather or all-reduce it), not its own share alone."
)


def _probe_problem(hook: Callable, make_state: Callable | None, ranks) -> str | None:
    """The scale on one hand-made bucket, then three steps of the digits CNN through the lab's probe."""
    from ..experiment import run

    problem = _scale_problem(hook, make_state, ranks)
    if problem is not None:
        return problem
    result = run(
        hook=hook, state_factory=make_state, model="cnn", steps=PROBE_STEPS, eval_every=0, cluster=ranks,
        world_size=ranks.world_size,
    )  # fmt: skip
    worst = worst_rank_spread(result.steps)
    if worst is not None:
        return f"{_DISAGREE} (On the CNN: rank_spread {worst['rank_spread']:.3g} at step {int(worst['step'])}.)"
    return None


def _named(baselines: Sequence[Score], label: str) -> Score | None:
    return next((b for b in baselines if b.label == label and b.value is not None), None)


def _bar(baselines: Sequence[Score]) -> tuple[Score, float]:
    """The best baseline, the one an entry must beat, and its score."""
    scored = [b for b in baselines if b.value is not None]
    if _named(scored, "fp16") is None:
        raise ValueError("the baselines hold no fp16 score: pass lab.challenge.baselines()")
    best = max(scored, key=lambda b: b.value or 0.0)
    return best, best.value or 0.0


def check_challenge_entry(
    attempt: Any,
    make_state: Callable | None,
    baselines: Sequence[Score],
    cluster: Any = None,
    world_sizes: Sequence[int] = WORLD_SIZES,
) -> Outcome:
    """Your ``hook(state, bucket)`` (and ``make_state(process_group)``, or None): read as the leaderboard's screen
    reads it, run at 2, 3 and 4 ranks (its scale on one bucket, then the digits CNN), then scored; right when it
    passes the screen, keeps DDP's invariant, averages at the right scale and scores above the best of
    ``baselines`` (which must hold fp16's). ``cluster``: a Cluster, or several, for the sizes they have (the score
    runs on the 2-rank one). The outcome's value is your :class:`Entry` when right, else the reference entry."""
    best, bar = _bar(baselines)
    two = clusters_by_size(cluster).get(2)
    scored: dict[str, Score] = {}

    def verify(fn: Callable) -> str | None:
        problem = _source_problem(fn, make_state)
        if problem is None:
            problem = first_problem_by_world_size(
                lambda ranks: _probe_problem(fn, make_state, ranks), cluster, world_sizes
            )
        if problem is not None:
            return problem
        entry = scored["entry"] = score(fn, state_factory=make_state, label="your entry", cluster=two)
        if entry.value is None:
            return f"the challenge disqualified it: {entry.disqualified}"
        if entry.value <= bar:
            return f"it scores {entry.value:.2f}, {best.label} {bar:.2f}: {_below(entry, baselines)}"
        return None

    outcome = check_function(
        "challenge_entry",
        attempt,
        verify,
        f"The ranks agree at {listed(world_sizes)} ranks, and your entry beats {best.label}'s {bar:.2f}.",
        later="The rest of the notebook uses the reference entry, a top-k with error feedback in float16.",
    )
    if outcome.status == RIGHT:
        outcome.value = Entry(attempt, make_state, scored["entry"])
    else:
        reference_score = score(entry_hook, state_factory=entry_state, label="the reference entry", cluster=two)
        outcome.value = Entry(entry_hook, entry_state, reference_score)
    return outcome


def _parts(entry: Score) -> str:
    return "; ".join(
        f"{t['task']}: accuracy {t['accuracy']:.4f}, {t['bytes_per_rank']:,} bytes a rank, speed {t['speed']:.3f}"
        for t in entry.tasks
    )


def _below(entry: Score, baselines: Sequence[Score]) -> str:
    fp16 = _named(baselines, "fp16")
    theirs = {t["task"]: t["bytes_per_rank"] for t in fp16.tasks} if fp16 is not None else {}
    more = [t["task"] for t in entry.tasks if t["bytes_per_rank"] >= theirs.get(t["task"], 0)]
    if more:
        advice = (
            f"on {' and '.join(more)} it sends at least fp16's bytes (half of all-reduce's). Send fewer numbers, or "
            "smaller ones."
        )
    else:
        advice = (
            "it sends less than fp16, but loses more accuracy than its bytes earn: keep more of each gradient, or "
            "carry what it drops into the next step if it does not yet (error feedback)."
        )
    return f"{advice} Yours: {_parts(entry)}."


def _source_problem(hook: Callable, make_state: Callable | None) -> str | None:
    """What the leaderboard would refuse in the file your entry becomes: the screen's reasons, or a name your
    functions use that the file does not define (a helper or an import from another cell)."""
    try:
        source = entry_source(hook, make_state)
    except (TypeError, OSError, ValueError) as exc:
        return f"the leaderboard cannot read your entry's source: {exc}"
    refused = screen(source)
    if refused:
        return f"the leaderboard's screen would refuse it: {'; '.join(map(str, refused[:3]))}."
    namespace: dict = {}
    exec(compile(source, "your entry", "exec"), namespace)  # screened: imports torch and defines functions
    missing = sorted(
        name
        for fn in (namespace.get("hook"), namespace.get("make_state"))
        if callable(fn)
        for name in _globals_used(fn.__code__)
        if name not in namespace and not hasattr(builtins, name)
    )
    if missing:
        return (
            f"your entry uses {', '.join(missing)}, defined outside hook and make_state: only those two functions "
            "travel to the leaderboard, so import or define what they use inside them."
        )
    return None


def _globals_used(code: types.CodeType) -> set[str]:
    """The global names a function's code (and the functions and lambdas inside it) reads."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_used(const)
    return names


def entry_source(hook: Callable, make_state: Callable | None) -> str:
    """The submission file's text for ``hook`` and ``make_state``: their source with the imports a hook needs, named
    as the leaderboard looks for them. Only these two functions travel: a helper they call must be defined inside
    them."""
    parts = ["import torch\nimport torch.distributed as dist"]
    for fn, as_name in ((hook, "hook"), (make_state, "make_state")):
        if fn is None:
            continue
        if getattr(fn, "__name__", "<lambda>") == "<lambda>" or not inspect.isfunction(fn):
            raise ValueError(f"give {as_name} as a function written with def: the leaderboard reads its source")
        source = textwrap.dedent(inspect.getsource(fn)).rstrip().splitlines()
        parts.append("\n".join(source[_first_def(source) :]))  # without its decorators (the course's @reference)
        if fn.__name__ != as_name:
            parts.append(f"{as_name} = {fn.__name__}")
    return "\n\n\n".join(parts) + "\n"


def write_entry(entry: Entry, folder: str | Path, name: str = "my_entry") -> Path:
    """``entry`` as a submission file, ``folder/name.py`` (:func:`entry_source`): what you would hand in."""
    from ..safe_files import Folder

    with Folder.open(Path(folder), "give a folder you can write your entry to", create=True) as where:
        where.write(f"{name}.py", entry_source(entry.hook, entry.make_state).encode())
    return Path(folder) / f"{name}.py"


def _first_def(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith("def "))

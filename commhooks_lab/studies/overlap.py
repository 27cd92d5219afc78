"""Overlap, measured: when each bucket's communication runs, against when backward computes.

DDP calls a bucket's hook as soon as the bucket's gradients are ready, during backward, and
waits for every bucket's Future only at the end of backward. A hook that *starts* its collective
and returns (PyTorch's ``allreduce_hook``, ``fp16_compress_hook``) lets the collective run while
autograd computes the next buckets' gradients; a hook that waits inside (the zoo's compressors,
whose ``all_gather`` is blocking, and every hook under the lab's probe, which waits for each
bucket's Future) holds backward until its bucket is sent.

:func:`bucket_timeline` runs one backward on real ranks with each hook wrapped by a stopwatch:
per bucket, when its hook was called (``ready``), when the hook returned (``returned``) and when its
Future completed (``done``); and when backward returned (``end``). DDP's own C++ all-reduce
(``hook="no"``) cannot be wrapped from Python: ``allreduce_hook`` issues the same asynchronous
all-reduce from Python and stands in for it. It also times hook functions you pass (``{label: hook}``), behind a
slow ``link=``; :func:`overlap_spread` gives, per hook, ``hidden_share`` with its spread over ranks and repeats
(notebook 14 sets its overlapping hook against the same collectives waited for inside the hook).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

__all__ = [
    "HOOKS",
    "bucket_timeline",
    "computing_spans",
    "hidden_share",
    "merged_intervals",
    "overlap_length",
    "overlap_spread",
    "overlap_summary",
    "plot_timeline",
    "total_length",
]

#: The line-up: two hooks that return at once, one that blocks inside, and a hook under the lab's probe.
HOOKS = ("allreduce", "fp16", "topk", "allreduce (lab probe)")


def _rank_timeline(
    ctx, hooks: Sequence[str | tuple[str, Any]], width: int, depth: int, bucket_cap_mb: float, repeats: int, batch: int
) -> list:
    """In each rank: for every hook, ``repeats`` timed backwards of a ``depth`` x ``width`` MLP on ``batch`` rows.
    A hook is a registry name, or (label, a hook function called with state None)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..hooks.choice import build_hook, check_hook_choice
    from ..measure.probe import Probe

    out = []
    for entry in hooks:
        label, given = (entry, None) if isinstance(entry, str) else entry
        name, probed = label.removesuffix(" (lab probe)"), label.endswith(" (lab probe)")
        torch.manual_seed(0)
        layers = [torch.nn.Linear(width, width) for _ in range(depth)]
        model = DDP(torch.nn.Sequential(*layers), bucket_cap_mb=bucket_cap_mb)
        hook, state = (given, None) if given is not None else build_hook(check_hook_choice(name))
        assert hook is not None, f"{name} registers no Python hook to time"
        if probed:
            hook = Probe(list(model.named_parameters()), ctx.world_size, ctx.rank, measure=False).wrap(hook)
        records: list[dict[str, Any]] = []

        def timed(state, bucket, hook=hook, records=records):
            ready = time.perf_counter()
            future = hook(state, bucket)
            returned = time.perf_counter()
            pending = not future.done()  # a hook that waits inside hands back a completed Future
            index = bucket.index()

            def finished(fut):
                records.append(
                    {"bucket": index, "ready": ready, "returned": returned, "done": time.perf_counter(),
                     "pending_at_return": pending}
                )  # fmt: skip
                return fut.value()

            return future.then(finished)

        model.register_comm_hook(state, timed)
        x = torch.randn(batch, width, generator=torch.Generator().manual_seed(ctx.rank))
        for repeat in range(repeats + 2):  # two untimed steps: DDP rebuilds its buckets after the first
            records.clear()
            model.zero_grad()
            loss = model(x).square().mean()
            start = time.perf_counter()
            loss.backward()
            end = time.perf_counter()
            if repeat >= 2:
                out += [
                    {
                        "hook": label,
                        "repeat": repeat - 2,
                        "rank": ctx.rank,
                        **r,
                        "ready": r["ready"] - start,
                        "returned": r["returned"] - start,
                        "done": r["done"] - start,
                        "end": end - start,
                    }
                    for r in records
                ]
    return out


def bucket_timeline(
    hooks: Sequence[str] | dict[str, Any] = HOOKS,
    world_size: int = 2,
    width: int = 512,
    depth: int = 8,
    bucket_cap_mb: float = 1.0,
    repeats: int = 5,
    cluster=None,
    batch: int = 64,
    link: str | None = None,
):
    """A table with one row per rank, hook, repeat and bucket: seconds after backward started.

    ``hooks``: registry names, or {label: hook function} (a hook you wrote, called with state None).
    ``link``: the ranks behind a rate-limited link (``"100mbit"``), where communication takes long enough to hide.
    """
    import pandas as pd

    from ..launcher import Ranks, RankSpec

    entries = list(hooks.items()) if isinstance(hooks, dict) else list(hooks)
    with Ranks(cluster, fresh=cluster is None) as ranks:  # yours, else ranks of its own
        rows = ranks(RankSpec(world_size, link=link)).run(
            _rank_timeline, entries, width, depth, bucket_cap_mb, repeats, batch
        )
    return pd.DataFrame([row for rank_rows in rows for row in rank_rows])


def merged_intervals(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``intervals`` sorted, those that touch or overlap merged into one: time counted once however many buckets
    share it (notebook 13's exercise builds its slips' answers from these four helpers)."""
    merged: list[tuple[float, float]] = []
    for start, stop in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def total_length(intervals: list[tuple[float, float]]) -> float:
    """The summed length of disjoint intervals."""
    return sum(b - a for a, b in intervals)


def overlap_length(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two unions of disjoint intervals."""
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in xs for c, d in ys)


def computing_spans(buckets: Sequence[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """When autograd computes: from 0 to the last bucket's ready time, except inside hook calls."""
    compute_end = max(ready for ready, _, _ in buckets)
    in_hooks = merged_intervals(
        [(ready, min(returned, compute_end)) for ready, returned, _ in buckets if ready < compute_end]
    )
    computing, at = [], 0.0
    for a, b in in_hooks:
        computing.append((at, a))
        at = b
    return [*computing, (at, compute_end)]


def hidden_share(buckets: Sequence[tuple[float, float, float]]) -> float:
    """The share of one backward's communication that ran while autograd computed.

    ``buckets``: ``(ready, returned, done)`` per bucket, seconds after backward started. A bucket
    communicates from ``ready`` (its hook is called) to ``done`` (its Future completes); buckets
    that communicate at the same time count once. Autograd computes from 0 until the last bucket
    is ready, except while the backward thread is inside a hook call (``ready`` to ``returned``).
    """
    comm = merged_intervals([(ready, done) for ready, _, done in buckets])
    return overlap_length(comm, computing_spans(buckets)) / total_length(comm)


def _one_backward(rows) -> dict:
    buckets = list(zip(rows["ready"], rows["returned"], rows["done"]))
    end = float(rows["end"].iloc[0])
    inside = ((rows["returned"] - rows["ready"]) / (rows["done"] - rows["ready"])).median()
    compute = total_length(computing_spans(buckets))
    return {
        "buckets": len(rows),
        "backward_ms": 1e3 * end,
        "compute_ms": 1e3 * compute,
        "comm_ms": 1e3 * total_length(merged_intervals([(r, d) for r, _, d in buckets])),
        "hidden_share": hidden_share(buckets),
        "exposed_ms": 1e3 * (end - compute),
        "in_hook_share": float(inside),
        "pending_at_return": float(rows["pending_at_return"].mean()),
    }


def overlap_summary(timeline) -> Any:
    """Per hook, the median over ranks and repeats of: backward time, autograd's compute time within it,
    communication time (from each hook call to its Future's completion, overlapping buckets merged),
    the share of communication that ran while autograd computed (``hidden_share``), the backward time
    not spent computing (``exposed_ms``), the share of a bucket's communication time spent inside
    the hook call (``in_hook_share``: 1 for a hook that blocks), and the share of buckets whose Future was still
    running when the hook returned (``pending_at_return``: 0 for a hook that blocks, by construction)."""
    order = list(dict.fromkeys(timeline["hook"]))
    return _per_backward(timeline).groupby("hook").median().loc[order]


def _per_backward(timeline) -> Any:
    """One row per hook, rank and repeat: :func:`_one_backward`'s numbers."""
    import pandas as pd

    rows = timeline.groupby(["hook", "rank", "repeat"])
    return pd.DataFrame([{"hook": hook, **_one_backward(one)} for (hook, _, _), one in rows])


def overlap_spread(
    hooks: dict[str, Any],
    link: str | None = "100mbit",
    world_size: int = 2,
    width: int = 256,
    depth: int = 8,
    batch: int = 1024,
    bucket_cap_mb: float = 0.25,
    repeats: int = 5,
    cluster=None,
) -> Any:
    """Per hook, in timing mode (each hook wrapped only by a stopwatch, never by the probe's waits): the median,
    min and max over ranks and repeats of ``hidden_share`` and of the backward time, with the median compute and
    communication times.

    The default shape is chosen so that behind 100 Mbit/s a backward's compute and its communication are of the
    same order (eight 256 x 256 layers: 2.1 MB of gradients in 8 buckets, about 0.25 s to all-reduce there and
    about as long to back-propagate 1024 rows through, here): overlap can hide at most the compute time, so a
    link much slower than the compute leaves little to hide for any hook. ``attrs`` holds the set-up.
    """
    import pandas as pd

    timeline = bucket_timeline(hooks, world_size, width, depth, bucket_cap_mb, repeats, cluster, batch, link)
    by_hook = _per_backward(timeline).groupby("hook", sort=False)
    table = pd.DataFrame(
        {
            "hidden_share": by_hook["hidden_share"].median(),
            "hidden_share_min": by_hook["hidden_share"].min(),
            "hidden_share_max": by_hook["hidden_share"].max(),
            "backward_ms": by_hook["backward_ms"].median(),
            "backward_ms_min": by_hook["backward_ms"].min(),
            "backward_ms_max": by_hook["backward_ms"].max(),
            "compute_ms": by_hook["compute_ms"].median(),
            "comm_ms": by_hook["comm_ms"].median(),
            "pending_at_return": by_hook["pending_at_return"].median(),
            "buckets": by_hook["buckets"].median(),
            "backwards": by_hook["hidden_share"].size(),
        }
    ).loc[list(hooks)]
    table.attrs = {
        "link": link,
        "world_size": world_size,
        "parameters": depth * (width * width + width),
        "batch": batch,
        "bucket_cap_mb": bucket_cap_mb,
    }
    return table


def plot_timeline(timeline, rank: int = 0, repeat: int = 0):
    """One backward per hook: each bucket's communication as a bar from its hook call to its Future's
    completion (the part inside the hook call darker), the end of backward's compute and of backward."""
    import matplotlib.pyplot as plt

    from .._util import fit_titles

    hooks = list(dict.fromkeys(timeline["hook"]))
    fig, axes = plt.subplots(len(hooks), 1, figsize=(8, 1.2 + 1.1 * len(hooks)), sharex=True, constrained_layout=True)
    for ax, hook in zip(list(getattr(axes, "flat", [axes])), hooks):
        rows = timeline[(timeline["hook"] == hook) & (timeline["rank"] == rank) & (timeline["repeat"] == repeat)]
        for y, r in enumerate(rows.sort_values("ready").itertuples()):
            ax.barh(y, 1e3 * (r.done - r.ready), left=1e3 * r.ready, color="tab:blue", alpha=0.35)
            ax.barh(y, 1e3 * (r.returned - r.ready), left=1e3 * r.ready, color="tab:blue")
        ax.axvline(1e3 * rows["ready"].max(), color="tab:green", lw=1, label="last gradient ready")
        ax.axvline(1e3 * rows["end"].iloc[0], color="tab:red", lw=1, label="backward returns")
        ax.set_ylabel(f"{hook}\n(a row per bucket)", rotation=0, ha="right", va="center")
        ax.set_yticks([])
    ax.set_xlabel(f"ms after backward started (rank {rank}); dark: inside the hook call, light: after it returned")
    # under the panels: the bars' and lines' places move with each run's timings, so no corner inside stays empty
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize=8)
    fig.suptitle(f"One backward per hook: when each bucket's communication runs (rank {rank})")
    return fit_titles(fig)

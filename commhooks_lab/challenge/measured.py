"""The time a hook's steps take behind a real rate-limited link, beside the score and never part of it.

A measured time moves from machine to machine and from run to run (how busy the cores are, how the kernel paces the
link), so the score rests on the α/β model and this is reported next to it, labelled as measured here: each task
run again behind ``link`` (every rank behind a link of its own, the lab's private network), timed as DDP runs the
hook (``timing=True``: unprobed), beside all-reduce behind the same link; on a task on nodes, ``link`` is each node's
uplink (:mod:`commhooks_lab.launcher.topology`). Needs user namespaces, as every link does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .tasks import ChallengeTask

__all__ = ["measure_behind_link", "describe_measured"]


def _step_ms(result) -> dict:
    """Median, lowest and highest step time in ms, step 0 left out (:meth:`Result.step_ms`: DDP builds its buckets
    in the first)."""
    return {f"{k}_ms": float(v) for k, v in result.step_ms(skip=1).items() if k != "steps"}


def measure_behind_link(
    hook: Any,
    link: str,
    tasks: Sequence[ChallengeTask],
    state_factory: Callable | None = None,
    state_options: dict | None = None,
    timeout_s: float | None = None,
) -> list[dict]:
    """Each task's step times behind ``link``, the hook's and all-reduce's, on ranks started for that link."""
    from ..experiment import run

    rows = []
    for task in tasks:
        options: dict[str, Any] = {**task.run_options(), "link": link, "timing": True, "measure": False}
        if timeout_s is not None:
            options["timeout_s"] = timeout_s
        mine = run(hook=hook, state_factory=state_factory, state_options=dict(state_options or {}), **options)
        theirs = run(hook="allreduce", **options)
        rows.append({"task": task.name, "link": link, "hook": _step_ms(mine), "allreduce": _step_ms(theirs)})
    return rows


def describe_measured(rows: Sequence[dict]) -> list[str]:
    """The report's lines for ``rows``: measured here, with its spread, and not part of the score."""
    lines = []
    for row in rows:
        if "unmeasured" in row:
            lines.append(f"  not measured behind {row['link']} here: {row['unmeasured']}")
            continue
        mine, theirs = row["hook"], row["allreduce"]
        lines.append(
            f"  measured here behind {row['link']} (varies from machine to machine; not in the score): {row['task']} "
            f"{mine['median_ms']:.1f} ms a step (lowest {mine['min_ms']:.1f}, highest {mine['max_ms']:.1f}), "
            f"all-reduce {theirs['median_ms']:.1f} ms ({theirs['min_ms']:.1f}-{theirs['max_ms']:.1f})"
        )
    return lines

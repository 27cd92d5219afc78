"""``commhooks-lab challenge leaderboard DIR``: every submission in a folder re-run by the lab, ranked, and written
as one HTML page that opens offline (no script, no font, no image fetched). The page holds nothing that changes
between runs, no timestamp, no path: the same folder gives the same page, bit for bit; except, where ``link=`` asks
for them, the times measured behind a real link, which are labelled as varying from machine to machine."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from .. import __version__
from .sandbox import DEFAULT_BUDGET, Budget, isolation, score_submission
from .score import FORMULA, Score, baseline_specs, ranked, task_set_name
from .submission import Submission, read_submission, submission_paths
from .tasks import REFERENCE_NETWORK, TASKS, ChallengeTask, task_set_of, tasks_of

__all__ = ["PAGE", "build", "leaderboard", "render", "ranked"]

#: The page's name inside the submissions folder.
PAGE = "leaderboard.html"

_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse}"
    "td,th{border:1px solid #bbb;padding:.3em .6em;text-align:right;vertical-align:top}td.l,th.l{text-align:left}"
    "tr.out td{color:#888}code{font-size:90%}"
)


def _versions(scores: Sequence[Score]) -> str:
    """The torch and numerics the scores were made with (the fingerprints digest both): one each, or every one."""
    return ", ".join(
        f"{key} {' / '.join(sorted({str(s.versions.get(key)) for s in scores if s.versions.get(key)}) or ['?'])}"
        for key in ("torch", "numerics")
    )


def _parts(score: Score) -> str:
    rows = []
    for t in score.tasks:
        rows.append(
            f"{html.escape(t['task'])}: accuracy {t['accuracy']:.4f}, {t['bytes_per_rank']:,} B/rank, "
            f"rank_spread {t['rank_spread']:.3g}, t_hook {t['t_hook_s']:.4f} s / t_allreduce {t['t_allreduce_s']:.4f}"
            f" s, speed {t['speed']:.3f}, points {t['points']:.4f}"
        )
    if score.measured:
        from .measured import describe_measured

        rows += [html.escape(line.strip()) for line in describe_measured(score.measured)]
    return "<br>".join(rows)


def render(scores: Sequence[Score], isolation_note: str, tasks: Sequence[ChallengeTask] = TASKS) -> str:
    """The page for ``scores`` (in rank order), made on ``tasks``."""
    on_nodes = any(t.nodes > 1 for t in tasks)
    lines = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Hook challenge leaderboard</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>Hook challenge leaderboard</h1>",
        f"<p>Task set <code>{html.escape(' / '.join(sorted({s.task_set for s in scores}) or [task_set_of(tasks)]))}"
        "</code>: "
        + html.escape(", ".join(f"{t.name} ({t.steps} steps, seed {t.seed}, {t.world_size} ranks)" for t in tasks))
        + f". commhooks_lab {html.escape(__version__)}; {html.escape(_versions(scores))}.</p>",
        f"<p><code>{html.escape(FORMULA)}</code>. Reference network: "
        f"{html.escape(REFERENCE_NETWORK.describe(nodes=on_nodes))}.</p>",
        f"<p>Each submission ran in: {html.escape(isolation_note)}.</p>",
        '<table><tr><th>#</th><th class="l">entry</th><th>score</th><th class="l">parts</th>'
        '<th class="l">fingerprint</th></tr>',
    ]
    place = 0
    for s in scores:
        if s.value is not None:
            place += 1
        shown = f"{s.value:.2f}" if s.value is not None else "—"
        parts = _parts(s) if s.value is not None else f"disqualified: {html.escape(s.disqualified or '')}"
        source = s.versions.get("source_sha256")
        source_line = f"<br>source <code>{html.escape(str(source))}</code>" if source else ""
        lines.append(
            f'<tr class="{"in" if s.value is not None else "out"}"><td>{place if s.value is not None else ""}</td>'
            f'<td class="l">{html.escape(s.label)}</td><td>{shown}</td><td class="l">{parts}</td>'
            f'<td class="l"><code>{s.fingerprint}</code>{source_line}</td></tr>'
        )
    lines += ["</table>", "</body></html>", ""]
    return "\n".join(lines)


def build(
    folder: str | Path,
    tasks: str | Sequence[ChallengeTask] = TASKS,
    budget: Budget = DEFAULT_BUDGET,
    baselines: bool = True,
    link: str | None = None,
    rank_python: str | None = None,
) -> list[Score]:
    """Every submission in ``folder`` scored in its sandbox on ``tasks`` (a set's name or the tasks), and the lab's
    baselines (by name) beside them; ``rank_python``: the interpreter every run's ranks are spawned with (a wrapper
    running Python under qemu's other CPU, say: :mod:`.sandbox`)."""
    tasks = tasks_of(tasks)
    scores = []
    for path in submission_paths(folder):
        try:
            submission = read_submission(path)
        except (OSError, ValueError) as exc:
            why = f"not readable as a submission: {exc}"
            scores.append(Score(path.stem, disqualified=why, task_set=task_set_name(tasks)))
            continue
        scored = score_submission(submission, tasks, budget, link=link, rank_python=rank_python)
        scored.versions["source_sha256"] = submission.source_sha256
        scores.append(scored)
    if baselines:
        for name, spec in baseline_specs(tasks).items():
            entry = Submission(f"baseline: {name}", _baseline_source(spec))
            scored = score_submission(entry, tasks, budget, link=link, rank_python=rank_python)
            scores.append(scored)
    return ranked(scores)


def _baseline_source(spec: str) -> str:
    """A baseline as a submission: the lab's registered hook, by name (run in the sandbox like any entry)."""
    return f"HOOK_SPEC = {spec!r}\n"


def leaderboard(
    folder: str | Path,
    out: str | Path | None = None,
    tasks: str | Sequence[ChallengeTask] = TASKS,
    budget: Budget = DEFAULT_BUDGET,
    baselines: bool = True,
    link: str | None = None,
    rank_python: str | None = None,
) -> Path:
    """Score every submission in ``folder`` and write the page (default: ``folder/leaderboard.html``)."""
    from ..safe_files import Folder

    tasks = tasks_of(tasks)
    scores = build(folder, tasks, budget, baselines, link, rank_python)
    page = render(scores, isolation()[1], tasks).encode()
    target = Path(out) if out is not None else Path(folder) / PAGE
    with Folder.open(target.parent, "give a folder you can write the leaderboard to") as where:
        where.write(target.name, page)
    return target

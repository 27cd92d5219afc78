"""How long from clicking Run to seeing plots? HookLab's first click in a fresh kernel, then warm clicks.

First click: a new interpreter imports the lab (which starts the rank server), makes a HookLab (which starts
the session's ranks in the background) and clicks Run, at once or after a pause of 1 s or 3 s (a person
reading the controls); timed by the dashboard itself (``last_click_s``), medians over ``--repeats``
interpreters (target <= 1.0 s). A click at once also waits for the rank server to finish importing what a rank
needs (torch, and torch._dynamo, which DDP's constructor touches: about 3 s in all, begun by ``import
commhooks_lab``), so it shows that start-up floor, not the dashboard. Warm: later clicks in one process on the
session's ranks (target <= 0.3 s), with the time the ranks took and the time spent updating the figures in
place (bqplot marks), beside the baseline it replaced: redrawing the same figures with matplotlib as PNGs
(``plots.overview`` + ``plots.gradient_agreement``, as the dashboard did before), and how many points the
error curve had gained before the run ended (it grows per step while the ranks train). Each click runs
``--steps`` MLP steps.

    python bench/dashboard.py [--repeats 5] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from _fresh import cell, median, time_fresh  # noqa: E402

HOOKS = ("fp16", "power_sgd")
PAUSES_S = (0.0, 1.0, 3.0)

_FIRST_CLICK = """
import time
t0 = time.perf_counter()
import matplotlib

matplotlib.use("Agg")
from commhooks_lab.widgets import HookLab

board = HookLab(steps={steps})
time.sleep({pause})
board.hook.value = "{hook}"
board.run_button.click()
assert not board.error.value, board.error.value
print(board.last_click_s)
"""


def first_click_rows(repeats: int, steps: int) -> list[tuple]:
    """(hook, pause before the click, median s, min s, runs ok) for a first click in a fresh interpreter."""
    snippets = {
        (hook, pause): _FIRST_CLICK.format(steps=steps, pause=pause, hook=hook) for hook in HOOKS for pause in PAUSES_S
    }
    timed = time_fresh({f"{hook}|{pause}": code for (hook, pause), code in snippets.items()}, repeats)
    rows = []
    for hook, pause in snippets:
        times = timed[f"{hook}|{pause}"]["times"]
        rows.append((hook, pause, median(times), min(times) if times else None, f"{len(times)}/{repeats} ok"))
    return rows


def print_first_click(rows: list[tuple], repeats: int, steps: int) -> None:
    print(
        f"\nHookLab first click in a fresh interpreter, {steps} MLP steps, 2 ranks, "
        f"median of {repeats} interpreters (target <= 1.0 s)\n"
    )
    print(f"{'hook':<12} {'clicked':<24} {'median s':>9} {'min s':>7}  runs")
    for hook, pause, m, fastest, runs in rows:
        when = "at once" if not pause else f"{pause:g} s after HookLab()"
        print(f"{hook:<12} {when:<24} {cell(m, 9, 2)} {cell(fastest, 7, 2)}  {runs}")


def _matplotlib_redraw_s(board) -> float:
    """The baseline: the same two figures drawn by matplotlib and encoded as PNGs, as the dashboard did before."""
    import io

    import matplotlib.pyplot as plt

    from commhooks_lab.plots import gradient_agreement, overview

    start = time.perf_counter()
    for fig in (overview(board.results[-board.max_plotted_runs :]), gradient_agreement(board.results[-1])):
        fig.savefig(io.BytesIO(), format="png", dpi=80)
        plt.close(fig)
    return time.perf_counter() - start


def warm_rows(repeats: int, steps: int) -> list[tuple]:
    """(hook, warm click s, last row s, figures s, matplotlib baseline s, points drawn before the end): medians."""
    import matplotlib

    matplotlib.use("Agg")
    from commhooks_lab.widgets import HookLab

    rows = []
    board = HookLab(steps=steps)
    grown: list[int] = []
    last_row_at = [0.0]
    add_rows = board.figures.add_rows

    def counting(rows: list[dict]) -> None:  # how long the error curve is when each step's row arrives
        add_rows(rows)
        grown.append(len(board.figures.error_lines[-1].x))
        last_row_at[0] = time.perf_counter()

    board.figures.add_rows = counting  # type: ignore[method-assign]
    try:
        board.run_button.click()  # the session's ranks are up from here on
        for hook in HOOKS:
            board.hook.value = hook
            warm, ranks, figures, baseline, points = [], [], [], [], []
            for _ in range(repeats):
                grown.clear()
                clicked = time.perf_counter()
                board.run_button.click()
                assert not board.error.value, board.error.value
                warm.append(board.last_click_s)
                ranks.append(last_row_at[0] - clicked)
                points.append(max(grown[:-1], default=0))  # before the last step's row
                start = time.perf_counter()
                board._render()
                figures.append(time.perf_counter() - start)
                baseline.append(_matplotlib_redraw_s(board))
            med = statistics.median
            rows.append((hook, med(warm), med(ranks), med(figures), med(baseline), min(points)))
    finally:
        board.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print_first_click(first_click_rows(args.repeats, args.steps), args.repeats, args.steps)
    rows = warm_rows(3 * args.repeats, args.steps)
    print(
        f"\nHookLab warm clicks, {args.steps} MLP steps, 2 ranks, median of {3 * args.repeats} clicks "
        "(target <= 0.3 s)\n"
    )
    print(
        f"{'hook':<12} {'warm click s':>12} {'last row s':>10} {'figures s':>10} {'matplotlib PNGs s':>18} "
        f"{'figures / PNGs':>15} {'points before the end':>22}"
    )
    for hook, wm, ranks, figures, baseline, points in rows:
        print(
            f"{hook:<12} {wm:>12.3f} {ranks:>10.3f} {figures:>10.3f} {baseline:>18.3f} {figures / baseline:>15.3f} "
            f"{f'{points} of {args.steps}':>22}"
        )


if __name__ == "__main__":
    main()

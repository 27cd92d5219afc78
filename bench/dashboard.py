"""How long from clicking Run to seeing plots? HookLab's first click in a fresh kernel, then warm clicks.

First click: a new interpreter imports the lab (which starts the rank server), makes a HookLab
(which starts the session's ranks in the background) and clicks Run, at once or after a pause
(a person reading the controls); timed by the dashboard itself (``last_click_s``), medians over
``--repeats`` interpreters (target <= 1.5 s). Warm: later clicks in one process on the session's
ranks, with the time spent rendering the two plots. Each click runs ``--steps`` MLP steps.

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
PAUSES_S = (0.0, 3.0)

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
        f"median of {repeats} interpreters (target <= 1.5 s)\n"
    )
    print(f"{'hook':<12} {'clicked':<24} {'median s':>9} {'min s':>7}  runs")
    for hook, pause, m, fastest, runs in rows:
        when = "at once" if not pause else f"{pause:g} s after HookLab()"
        print(f"{hook:<12} {when:<24} {cell(m, 9, 2)} {cell(fastest, 7, 2)}  {runs}")


def warm_rows(repeats: int, steps: int) -> list[tuple]:
    """(hook, median warm click s, median of which plots s), clicks in this process on the session's ranks."""
    import matplotlib

    matplotlib.use("Agg")
    from commhooks_lab.widgets import HookLab

    rows = []
    board = HookLab(steps=steps)
    try:
        board.run_button.click()  # the session's ranks are up from here on
        for hook in HOOKS:
            board.hook.value = hook
            warm, render = [], []
            for _ in range(repeats):
                board.run_button.click()
                assert not board.error.value, board.error.value
                warm.append(board.last_click_s)
                start = time.perf_counter()
                board._render()
                render.append(time.perf_counter() - start)
            rows.append((hook, statistics.median(warm), statistics.median(render)))
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
    print(f"\nHookLab warm clicks, {args.steps} MLP steps, 2 ranks, median of {3 * args.repeats} clicks\n")
    print(f"{'hook':<12} {'warm s':>8} {'of which plots s':>17}")
    for hook, wm, r in rows:
        print(f"{hook:<12} {wm:>8.2f} {r:>17.2f}")


if __name__ == "__main__":
    main()

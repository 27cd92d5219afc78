"""How long from clicking Run to seeing plots? HookLab driven in-process, cold and warm.

Cold: a new HookLab's first click (the ranks start). Warm: later clicks on the same
dashboard (a warm Cluster). Each click runs ``--steps`` MLP steps and renders both plots.
Prints medians, with the time split into the run and the rendering.

    python bench/dashboard.py [--repeats 5] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import matplotlib  # noqa: E402

matplotlib.use("Agg")
from commhooks_lab.widgets import HookLab  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    rows = []
    for hook in ("fp16", "power_sgd"):
        cold, warm, render = [], [], []
        for _ in range(args.repeats):
            lab = HookLab(steps=args.steps)
            lab.hook.value = hook
            lab.run_button.click()
            cold.append(lab.last_click_s)
            for _ in range(3):
                lab.run_button.click()
                warm.append(lab.last_click_s)
                start = time.perf_counter()
                lab._render()
                render.append(time.perf_counter() - start)
            assert not lab.error.value, lab.error.value
            lab.close()
        rows.append((hook, statistics.median(cold), statistics.median(warm), statistics.median(render)))
    print(
        f"\nHookLab click-to-plots, {args.steps} MLP steps, 2 ranks, median of {args.repeats} cold and "
        f"{3 * args.repeats} warm clicks\n"
    )
    print(f"{'hook':<12} {'cold s':>8} {'warm s':>8} {'of which plots s':>17} {'warm / cold':>12}")
    for hook, c, wm, r in rows:
        print(f"{hook:<12} {c:>8.2f} {wm:>8.2f} {r:>17.2f} {wm / c:>12.2f}")


if __name__ == "__main__":
    main()

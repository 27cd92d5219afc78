"""What portable numerics cost: step time of a run, and each notebook's run time, portable vs native.

Every variant runs in fresh interpreters (the numerics of a process tree are fixed when it imports the lab),
interleaved portable, native, portable, ... so machine noise hits both alike. Step time is the median
``step_time_s`` of a warm 2-rank run (forward, backward with the hook, optimizer step); ``--notebooks`` also
executes every notebook once per variant in a clean kernel.

    python bench/numerics.py [--repeats 3] [--notebooks]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from commhooks_lab.launcher.numerics import PORTABLE_VARIABLES  # noqa: E402

CASES = {
    "mlp fp16": "hook='fp16', model='mlp'",
    "mlp power_sgd r1": "hook='power_sgd', model='mlp', state_options={'matrix_approximation_rank': 1, "
    "'start_powerSGD_iter': 2}",
    "cnn allreduce": "hook='allreduce', model='cnn'",
}
STEP_CODE = """
import statistics, commhooks_lab as lab
lab.run(steps=3, {case})  # start the session's ranks, warm the caches
r = lab.run(steps=40, {case})
print(statistics.median(r.steps["step_time_s"].iloc[5:]))
"""


def environment(mode: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PORTABLE_VARIABLES}
    return {**env, "COMMHOOKS_LAB_NUMERICS": mode, "PYTHONPATH": str(ROOT)}


def step_time(mode: str, case: str) -> float:
    code = STEP_CODE.format(case=CASES[case])
    out = subprocess.run([sys.executable, "-c", code], env=environment(mode), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def notebook_times(mode: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "execute_notebooks.py"), "--out", f"/tmp/bench-numerics-{mode}"],
        env=environment(mode),
        capture_output=True,
        text=True,
        check=True,
    )
    times = {}
    for line in out.stdout.splitlines():
        seconds, _, name = line.strip().partition(" s  ")
        times[Path(name).stem] = float(seconds)
    return times


def row(name: str, portable: list[float], native: list[float], unit: str) -> str:
    p, n = statistics.median(portable), statistics.median(native)
    ratios = [a / b for a, b in zip(portable, native)]
    spread = f"({min(ratios):.2f}-{max(ratios):.2f})"
    return f"{name:34} {p:10.3f} {n:10.3f} {unit:3}  {statistics.median(ratios):5.2f}x {spread}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--notebooks", action="store_true", help="also time every notebook (minutes)")
    args = parser.parse_args()
    print(f"{'':34} {'portable':>10} {'native':>10}      portable / native (min-max)")
    for case in CASES:
        times: dict[str, list[float]] = {"portable": [], "native": []}
        for _ in range(args.repeats):
            for mode in times:
                times[mode].append(step_time(mode, case))
        print(row(f"step time, {case}", [t * 1e3 for t in times["portable"]], [t * 1e3 for t in times["native"]], "ms"))
    if args.notebooks:
        runs: dict[str, list[dict[str, float]]] = {"portable": [], "native": []}
        for _ in range(max(1, args.repeats // 3)):
            for mode in runs:
                runs[mode].append(notebook_times(mode))
        for name in runs["portable"][0]:
            print(row(f"notebook {name}", [r[name] for r in runs["portable"]], [r[name] for r in runs["native"]], "s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

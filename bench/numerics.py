"""What portable numerics cost: step time of a run, and each notebook's run time, portable vs native.

Three variants: ``portable`` (the default: its AVX2 tier on a CPU that has AVX2), ``pre-avx2`` (the tier a CPU
without AVX2 runs, which was the lab's only one before: ATen's plain kernels, oneDNN at SSE4.1, forced here with
native numerics and those settings), and ``native``. Every variant runs in fresh interpreters (the numerics of a
process tree are fixed when it imports the lab), interleaved portable, pre-avx2, native, portable, ... so machine
noise hits all alike. Step time is the median
``step_time_s`` of steps 10-119 of a warm 2-rank run (forward, backward with the hook, optimizer step; a
millisecond step on two shared cores needs that many for a median that repeats); ``--notebooks`` also
executes every notebook once per variant in a clean kernel. ``--per-library`` adds a variant per library: native
numerics with only that library's portable setting, to show which cap a row's cost comes from.

    python bench/numerics.py [--repeats 5] [--notebooks] [--per-library]
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
r = lab.run(steps=120, {case})
print(statistics.median(r.steps["step_time_s"].iloc[10:]))
"""


#: The pre-AVX2 tier's settings (what a CPU without AVX2 falls to under portable numerics), on any CPU.
PRE_AVX2 = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}
VARIANTS = ("portable", "pre-avx2", "native")


#: Variants that run native numerics with some settings forced: the pre-AVX2 tier, and each library's cap alone.
FORCED = {"pre-avx2": PRE_AVX2, **{name: {name: value} for name, value in PORTABLE_VARIABLES.items()}}


def environment(mode: str) -> dict[str, str]:
    """A variant's environment: a mode (portable, native), or a FORCED variant on native numerics."""
    env = {k: v for k, v in os.environ.items() if k not in PORTABLE_VARIABLES}
    if mode in FORCED:
        return {**env, "COMMHOOKS_LAB_NUMERICS": "native", **FORCED[mode], "PYTHONPATH": str(ROOT)}
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


def _ratio(times: list[float], native: list[float]) -> str:
    ratios = [a / b for a, b in zip(times, native)]
    return f"{statistics.median(ratios):5.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def row(name: str, times: dict[str, list[float]], unit: str) -> str:
    medians = " ".join(f"{statistics.median(times[v]):10.3f}" for v in VARIANTS)
    ratios = "  ".join(_ratio(times[v], times["native"]) for v in times if v != "native")
    return f"{name:34} {medians} {unit:3}  {ratios}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--notebooks", action="store_true", help="also time every notebook (minutes)")
    parser.add_argument(
        "--per-library", action="store_true", help="also step times with one library's portable setting alone"
    )
    args = parser.parse_args()
    names = " ".join(f"{v:>10}" for v in VARIANTS)
    alone = list(PORTABLE_VARIABLES) if args.per_library else []
    print(f"{'':34} {names}      portable / native (min-max)  pre-avx2 / native", *(f"{v} / native" for v in alone))
    for case in CASES:
        times: dict[str, list[float]] = {v: [] for v in (*VARIANTS, *alone)}
        for _ in range(args.repeats):
            for mode in times:
                times[mode].append(1e3 * step_time(mode, case))
        print(row(f"step time, {case}", times, "ms"), flush=True)
    if args.notebooks:
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for _ in range(max(1, args.repeats // 5)):
            for mode in runs:
                runs[mode].append(notebook_times(mode))
        for name in runs["portable"][0]:
            print(row(f"notebook {name}", {v: [r[name] for r in runs[v]] for v in VARIANTS}, "s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

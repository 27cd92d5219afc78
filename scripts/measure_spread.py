"""How far each notebook's printed numbers move on other kernel paths and under another seed set.

    python scripts/measure_spread.py [--write] [--keep DIR] [notebooks/04_powersgd.ipynb ...]

Executes the notebooks (clean kernels, as ``execute_notebooks.py``) once per kernel path of
``commhooks_lab.testing.machines`` (native numerics) and once with portable numerics under
``COMMHOOKS_LAB_SEED_SET=1``, and compares every checked cell with the committed outputs. For each cell whose
numbers move on some kernel path it prints the largest relative move, and beside it how far the other seed set
moves the same numbers: the scale at which a change means something. ``--write`` states the tolerance in the
cell's metadata: twice the largest kernel-path move (one significant figure, rounded up), with what was
measured. A cell whose *text* or integers change on a kernel path gets no tolerance: it is listed, and must
be made robust (fewer digits, a statistic over more seeds) before tolerant checks can pass.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from commhooks_lab.launcher.numerics import PORTABLE_VARIABLES
from commhooks_lab.testing import machines
from commhooks_lab.testing.notebooks import METADATA_KEY, compare_notebooks, is_integer

ROOT = Path(__file__).resolve().parents[1]
SEED_SET = "seed set 1"
SAFETY = 2.0


def configurations() -> dict[str, dict[str, str]]:
    base = {k: v for k, v in os.environ.items() if k not in PORTABLE_VARIABLES}
    configs = {name: machines.environment(name, base) for name in machines.KERNEL_PATHS}
    configs[SEED_SET] = {**base, "COMMHOOKS_LAB_SEED_SET": "1"}
    return configs


def execute_all(paths: list[Path], keep: Path) -> dict[str, Path]:
    folders = {}
    for name, env in configurations().items():
        folder = keep / name.replace(" ", "_")
        print(f"== executing under {name}", flush=True)
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "execute_notebooks.py"), "--out", str(folder), *map(str, paths)],
            env=env,
            check=True,
        )
        folders[name] = folder
    return folders


def round_up(value: float) -> float:
    """``value`` rounded up to one significant figure (0.00237 -> 0.003)."""
    if value <= 0:
        return 0.0
    exponent = math.floor(math.log10(value))
    return math.ceil(value / 10**exponent) * 10**exponent


def needed(moved) -> tuple[float, float]:
    """(rtol, atol) that would just allow every move: relative where the committed number is not 0."""
    rtol = max((m.relative for m in moved if float(m.ref) != 0), default=0.0)
    atol = max((abs(float(m.new)) for m in moved if float(m.ref) == 0), default=0.0)
    return rtol, atol


def measure(path: Path, folders: dict[str, Path]) -> list[dict]:
    committed = nbformat.read(path, as_version=4)
    rows: dict[int, dict] = {}
    for name, folder in folders.items():
        executed = nbformat.read(folder / path.name, as_version=4)
        for report in compare_notebooks(committed, executed, tolerant=False):
            if report.same:
                continue
            row = rows.setdefault(report.cell, {"cell": report.cell, "moves": {}, "text": {}})
            integers = [f"{m.ref} -> {m.new}" for m in report.moved if is_integer(m.ref) and is_integer(m.new)]
            if not report.moved or integers:  # the text, an output's count, or an integer changed
                row["text"][name] = f"integers changed: {', '.join(integers[:5])}" if integers else report.problem
            else:
                row["moves"][name] = needed(report.moved)
    return [rows[c] for c in sorted(rows)]


def state(path: Path, rows: list[dict]) -> None:
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
        cell.metadata.pop(METADATA_KEY, None)
    for row in rows:
        kernel = {k: v for k, v in row["moves"].items() if k != SEED_SET}
        if not kernel or any(k != SEED_SET for k in row["text"]):
            continue
        rtol = max(r for r, _ in kernel.values())
        atol = max(a for _, a in kernel.values())
        seed = row["moves"].get(SEED_SET)
        measured = {name: {"rtol": r, "atol": a} for name, (r, a) in kernel.items()}
        if seed is not None:
            measured[SEED_SET] = {"rtol": seed[0], "atol": seed[1]}
        code[row["cell"]].metadata[METADATA_KEY] = {
            "tolerance": {
                "rtol": round_up(SAFETY * rtol),
                "atol": round_up(SAFETY * atol),
                "why": f"{SAFETY:g}x the largest move measured on kernel paths {', '.join(sorted(kernel))} "
                "(native numerics, scripts/measure_spread.py)",
                "measured": measured,
            }
        }
    nbformat.write(nb, path)


def main(argv: list[str]) -> int:
    write = "--write" in argv
    argv = [a for a in argv if a != "--write"]
    keep = None
    if argv[:1] == ["--keep"]:
        keep, argv = Path(argv[1]), argv[2:]
    paths = [Path(p).resolve() for p in argv] or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    with tempfile.TemporaryDirectory() as tmp:
        folders = execute_all(paths, keep or Path(tmp))
        for path in paths:
            rows = measure(path, folders)
            for row in rows:
                moves = ", ".join(f"{k} {r:.2g}" + (f" (atol {a:.2g})" if a else "") for k, (r, a) in row["moves"].items())
                texts = "; ".join(f"{k}: {t[:120]}" for k, t in row["text"].items())
                print(f"{path.name} cell {row['cell']}: {moves}" + (f" | TEXT {texts}" if texts else ""))
            if write:
                state(path, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""How far each notebook's printed numbers move on other kernel paths and under another seed set.

    python scripts/measure_spread.py [--write] [--keep DIR [--reuse]] [notebooks/04_powersgd.ipynb ...]

Executes the notebooks (clean kernels, as ``execute_notebooks.py``) once per kernel path of
``commhooks_lab.testing.machines`` (native numerics) and once with portable numerics under
``COMMHOOKS_LAB_SEED_SET=1``, and compares every checked cell with the committed outputs. For each cell whose
numbers move on some kernel path it prints the largest relative move, and beside it how far the other seed set
moves the same numbers: the scale at which a change means something. ``--write`` states the tolerance in the
cell's metadata: twice the largest kernel-path move (one significant figure, rounded up), with what was
measured. A cell whose *text* or integers change on a kernel path gets no tolerance: it is listed, and must
be made robust (fewer digits, a statistic over more seeds) before tolerant checks can pass. ``--keep DIR`` keeps
the executed copies; ``--reuse`` compares the copies already in DIR instead of executing again.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from commhooks_lab.launcher.numerics import PORTABLE_VARIABLES
from commhooks_lab.testing import machines
from commhooks_lab.testing.notebooks import METADATA_KEY, Tolerance, compare_notebooks, is_integer, tolerance_of
from commhooks_lab.testing.spread import SAFETY, SEED_SET, needed, tolerance_from

ROOT = Path(__file__).resolve().parents[1]
UNBOUNDED = 1e300


def configurations() -> dict[str, dict[str, str]]:
    base = {k: v for k, v in os.environ.items() if k not in PORTABLE_VARIABLES}
    configs = {name: machines.environment(name, base) for name in machines.KERNEL_PATHS}
    configs[SEED_SET] = {**base, "COMMHOOKS_LAB_SEED_SET": "1"}
    return configs


def execute_all(paths: list[Path], keep: Path, reuse: bool = False) -> dict[str, Path]:
    folders = {}
    for name, env in configurations().items():
        folder = keep / name.replace(" ", "_")
        folders[name] = folder
        if reuse:
            continue
        print(f"== executing under {name}", flush=True)
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "execute_notebooks.py"), "--out", str(folder), *map(str, paths)],
            env=env,
            check=True,
        )
    return folders


def any_move(notebook_metadata: dict, cell_metadata: dict) -> Tolerance:
    """Every number may move; the text must not, but for the patterns the cell declares volatile."""
    return Tolerance(UNBOUNDED, UNBOUNDED, volatile=tolerance_of(notebook_metadata, cell_metadata).volatile)


def measure(path: Path, folders: dict[str, Path]) -> list[dict]:
    committed = nbformat.read(path, as_version=4)
    rows: dict[int, dict] = {}
    for name, folder in folders.items():
        executed = nbformat.read(folder / path.name, as_version=4)
        for report in compare_notebooks(committed, executed, tolerant=True, tolerance_for=any_move):
            if report.same and not report.moved:
                continue
            row = rows.setdefault(report.cell, {"cell": report.cell, "moves": {}, "text": {}})
            integers = [f"{m.ref} -> {m.new}" for m in report.moved if is_integer(m.ref) and is_integer(m.new)]
            if not report.moved or integers:  # the text, an output's count, or an integer changed
                row["text"][name] = f"integers changed: {', '.join(integers[:5])}" if integers else report.problem
            else:
                row["moves"][name] = needed([(float(m.ref), float(m.new)) for m in report.moved])
    return [rows[c] for c in sorted(rows)]


VERDICT = re.compile(r"^(?P<claim>[^\n]*?):? (?P<value>True|False)$", re.MULTILINE)


def verdicts(nb) -> dict[tuple[int, str], str]:
    """Every printed check (a line ending in True or False) of every code cell: (cell, the claim) -> the value."""
    found = {}
    for number, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        for match in VERDICT.finditer(text):
            claim = re.sub(r"[-+]?\d[\d.e+-]*", "#", match["claim"])  # the numbers beside a check may move
            found[(number, claim)] = match["value"]
    return found


def flipped(path: Path, folders: dict[str, Path]) -> list[str]:
    """The printed checks whose verdict differs from the committed one, per configuration."""
    committed = verdicts(nbformat.read(path, as_version=4))
    lines = []
    for name, folder in folders.items():
        seen = verdicts(nbformat.read(folder / path.name, as_version=4))
        for key, value in committed.items():
            if seen.get(key) != value:
                lines.append(f"{path.name} cell {key[0]} under {name}: {key[1]!r} {value} -> {seen.get(key)}")
    return lines


def state(path: Path, rows: list[dict]) -> None:
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    volatile = {}
    for number, cell in enumerate(code):  # a cell's tolerance is measured anew; its other lab metadata stays
        ours = cell.metadata.get(METADATA_KEY, {})
        stated = ours.pop("tolerance", {})
        if stated.get("volatile"):
            volatile[number] = stated["volatile"]
            ours["tolerance"] = {"volatile": stated["volatile"]}
        if not ours:
            cell.metadata.pop(METADATA_KEY, None)
    for row in rows:
        kernel = {k: v for k, v in row["moves"].items() if k != SEED_SET}
        if not kernel or any(k != SEED_SET for k in row["text"]):
            continue
        measured = dict(kernel)
        if SEED_SET in row["moves"]:
            measured[SEED_SET] = row["moves"][SEED_SET]
        rtol, atol = tolerance_from(measured)
        code[row["cell"]].metadata.setdefault(METADATA_KEY, {})["tolerance"] = {
            "rtol": rtol,
            "atol": atol,
            "why": f"{SAFETY:g}x the largest move measured on kernel paths {', '.join(sorted(kernel))} "
            "(native numerics, scripts/measure_spread.py)",
            "measured": measured,
            **({"volatile": volatile[row["cell"]]} if row["cell"] in volatile else {}),
        }
    nbformat.write(nb, path)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT / "scripts"))
    from execute_notebooks import existing_notebook

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="state each moving cell's tolerance in its metadata")
    parser.add_argument("--keep", type=Path, help="keep the executed copies in this folder")
    parser.add_argument("--reuse", action="store_true", help="compare the copies already in --keep's folder")
    parser.add_argument("notebooks", nargs="*", type=existing_notebook, help="default: every notebook")
    args = parser.parse_args(argv)
    write, reuse, keep = args.write, args.reuse, args.keep
    paths = [p.resolve() for p in args.notebooks] or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    paths = paths if args.notebooks else [*paths, ROOT / "notebooks" / "template_your_lab.ipynb"]
    with tempfile.TemporaryDirectory() as tmp:
        folders = execute_all(paths, keep or Path(tmp), reuse and keep is not None)
        for path in paths:
            rows = measure(path, folders)
            for row in rows:
                moves = ", ".join(
                    f"{k} {m['rtol']:.2g}" + (f" (atol {m['atol']:.2g})" if m["atol"] else "")
                    for k, m in row["moves"].items()
                )
                texts = "; ".join(f"{k}: {t[:120]}" for k, t in row["text"].items())
                print(f"{path.name} cell {row['cell']}: {moves}" + (f" | TEXT {texts}" if texts else ""))
            checks, total = flipped(path, folders), len(verdicts(nbformat.read(path, as_version=4)))
            print(f"{path.name}: {total} printed checks, {len(checks)} flipped on another configuration")
            for line in checks:
                print("  FLIPPED", line)
            if write:
                state(path, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

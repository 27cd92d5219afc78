"""Record, in the committed notebooks, the outputs another kind of machine gives for the cells that depend on it.

    python scripts/record_variants.py --python /path/to/other/venv/bin/python notebooks/03_fp16_vs_bf16.ipynb ...

The other interpreter (a CUDA build of torch, say) executes each notebook into a temporary folder
(``scripts/execute_notebooks.py --out``). Each code cell's outputs there are compared with the committed ones, as
strict nbval compares them (machine notes left out). A cell that differs is recorded as a variant for the other
machine's facts (:mod:`commhooks_lab.testing.machine_outputs`) only if it declares the facts its outputs depend on
(``metadata.commhooks_lab.depends_on``) and the two machines differ in one of them; any other difference is a
regression or an undeclared dependence, and nothing is written. A declared cell that no longer differs loses its
variant. ``--executed DIR`` reuses copies that interpreter executed before.
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import nbformat

from commhooks_lab.testing.machine_outputs import (
    FACTS,
    machine_facts,
    set_variant,
    what_to_record,
    without_notes,
)
from commhooks_lab.testing.notebooks import STRICT, compare_outputs, compared_cells, flatten, sanitizer

ROOT = Path(__file__).resolve().parents[1]
FACTS_CODE = (
    "import json, torch; from commhooks_lab.testing.machine_outputs import machine_facts; "
    "print(json.dumps({**machine_facts(), 'torch': torch.__version__}))"
)


def facts_of(python: str) -> dict:
    """The other interpreter's machine facts, and its torch version (no fact, but worth saying)."""
    out = subprocess.run([python, "-c", FACTS_CODE], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def execute_with(python: str, notebooks: list[Path], folder: Path) -> None:
    script = ROOT / "scripts" / "execute_notebooks.py"
    subprocess.run([python, str(script), "--out", str(folder), *map(str, notebooks)], check=True, cwd=ROOT)


def _text(outputs: list, sanitize) -> str:
    flat = flatten(outputs, sanitize)
    return "\n".join(f"[{key}] {value}" for key, values in flat.items() for value in values)


def plan(committed: dict, executed: dict, here: dict, there: dict, sanitize) -> list[tuple[int, str, Any, list]]:
    """``(cell number, action, when or why, executed outputs)`` for every checked code cell of one notebook."""
    steps = []
    for number, ref, new in compared_cells(committed, executed):
        outputs = without_notes(new["outputs"])
        differs = not compare_outputs(without_notes(ref["outputs"]), outputs, STRICT, sanitize).same
        action, detail = what_to_record(ref.get("metadata", {}), differs, here, there)
        steps.append((number, action, detail, outputs))
    return steps


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", required=True, help="the other machine's interpreter (another venv's python)")
    parser.add_argument("--executed", type=Path, help="a folder of notebooks that interpreter executed already")
    parser.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args(argv)

    here = {**machine_facts(), "torch": __import__("torch").__version__}
    there = facts_of(args.python)
    changed = [name for name in FACTS if here[name] != there[name]]
    print(f"committed outputs: {here}\nother machine:     {there}")
    if not changed:
        print("the two machines have the same facts: there is nothing a variant could name")
        return 1
    if here["torch"].split("+")[0] != there["torch"].split("+")[0]:
        print(
            f"note: torch {here['torch']} here, {there['torch']} there; a release is no fact, so every difference "
            "recorded below is shown: each must be the declared fact's"
        )
    sanitize = sanitizer()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.executed or Path(tmp)
        if args.executed is None:
            execute_with(args.python, args.notebooks, folder)
        notebooks = {path: nbformat.read(path, as_version=4) for path in args.notebooks}
        plans = {
            path: plan(nb, nbformat.read(folder / path.name, as_version=4), here, there, sanitize)
            for path, nb in notebooks.items()
        }
    refused = [(path, n, why) for path, steps in plans.items() for n, action, why, _ in steps if action == "refuse"]
    for path, number, why in refused:
        print(f"REFUSED {path.name} cell {number}: {why}")
    if refused:
        print("nothing written")
        return 1
    for path, nb in notebooks.items():
        code = [c for c in nb.cells if c.cell_type == "code"]
        for number, action, when, outputs in plans[path]:
            if action == "same":
                continue
            assert isinstance(when, dict)
            cell = code[number]
            set_variant(cell.metadata, when, outputs if action == "record" else None)
            print(f"{action:6} {path.name} cell {number} when {when}")
            if action == "record":
                diff = difflib.unified_diff(
                    _text(cell.outputs, sanitize).splitlines(), _text(outputs, sanitize).splitlines(), lineterm="", n=0
                )
                print("\n".join(f"    {line[:160]}" for line in list(diff)[2:]))
        nbformat.write(nb, path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

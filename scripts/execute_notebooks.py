"""Execute the tutorials top to bottom in a clean kernel and save them with outputs.

    python scripts/execute_notebooks.py [--out DIR] [notebooks/03_fp16_vs_bf16.ipynb ...]

Outputs stay (nbval compares them); volatile metadata goes (timings, cell ids, kernel
details), so that a diff shows what the lessons say, not when they ran. Execution counts stay:
a clean top-to-bottom run numbers the cells 1..N, and nbval only checks cells that ran. Each notebook's run
time is printed: every one must stay under a minute on a 2-core machine. ``--out DIR`` saves the executed
copies in DIR and leaves the committed notebooks as they are (``measure_spread.py`` uses it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
KEEP_NOTEBOOK_METADATA = ("kernelspec", "language_info", "commhooks_lab")  # the last: stated tolerances
KEEP_CELL_METADATA = ("tags", "commhooks_lab")


def strip_volatile(nb: nbformat.NotebookNode) -> None:
    nb.metadata = {k: v for k, v in nb.metadata.items() if k in KEEP_NOTEBOOK_METADATA}
    nb.metadata.get("language_info", {}).pop("version", None)
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k in KEEP_CELL_METADATA}
        cell.pop("id", None)
        if cell.cell_type == "code":  # execution counts stay: 1..N from a clean run, and nbval needs them
            for output in cell.outputs:
                if output.get("metadata"):
                    output["metadata"] = {}
    nb.nbformat_minor = 4


def execute(path: Path, out: Path | None = None) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}, allow_errors=False
    ).execute()
    elapsed = time.perf_counter() - start
    strip_volatile(nb)
    nbformat.write(nb, path if out is None else out / path.name)
    return elapsed


def existing_notebook(arg: str) -> Path:
    """An argument that names a notebook file that is there (argparse's ``type``)."""
    path = Path(arg)
    if path.suffix != ".ipynb" or not path.is_file():
        raise argparse.ArgumentTypeError(f"{arg}: no such notebook (a path to an .ipynb file)")
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="save the executed copies here, leaving the committed ones")
    parser.add_argument("notebooks", nargs="*", type=existing_notebook, help="default: every numbered notebook")
    args = parser.parse_args(argv)
    out = args.out
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    for path in paths:
        elapsed = execute(path, out)
        print(f"{elapsed:6.1f} s  {path.relative_to(ROOT) if path.is_absolute() else path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

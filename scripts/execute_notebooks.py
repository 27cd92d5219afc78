"""Execute the tutorials top to bottom in a clean kernel and save them with outputs.

    python scripts/execute_notebooks.py [--out DIR] [notebooks/03_fp16_vs_bf16.ipynb ...]

Outputs stay (nbval compares them); volatile metadata goes (timings, cell ids, kernel
details), so that a diff shows what the lessons say, not when they ran. Execution counts stay:
a clean top-to-bottom run numbers the cells 1..N, and nbval only checks cells that ran. Notes about the machine
that ran them go (:mod:`commhooks_lab.launcher.notes`): the committed outputs are the lesson's. Each notebook's run
time is printed: every one must stay under a minute on a 2-core machine. ``--out DIR`` saves the executed
copies in DIR and leaves the committed notebooks as they are (``measure_spread.py`` uses it).

Every notebook asked for runs before any file is written: if one fails, none is saved, and the script says
which failed. The runs behind links a notebook made (:mod:`commhooks_lab.studies.recorded`) are installed
with it, for machines that cannot build links; on such a machine the recordings stay as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from commhooks_lab.launcher import netns_switch, notes
from commhooks_lab.studies import recorded

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
            cell.outputs = [output for output in cell.outputs if not notes.is_note(output)]
            for output in cell.outputs:
                if output.get("metadata"):
                    output["metadata"] = {}
    nb.nbformat_minor = 4


def run(path: Path, recording: Path) -> tuple[nbformat.NotebookNode, float]:
    """The notebook executed in a clean kernel, volatile metadata gone, and its run time; the runs behind links
    it made are appended to ``recording``."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    os.environ[recorded.VARIABLE] = str(recording)  # the kernel inherits it
    try:
        NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
            allow_errors=False,
        ).execute()  # fmt: skip
    finally:
        del os.environ[recorded.VARIABLE]
    elapsed = time.perf_counter() - start
    strip_volatile(nb)
    return nb, elapsed


def execute(path: Path, out: Path) -> float:
    """Execute one notebook and save it in ``out`` (the committed one and the recordings stay as they are)."""
    with tempfile.TemporaryDirectory() as scratch:
        nb, elapsed = run(path, Path(scratch) / "recording.json")
    nbformat.write(nb, out / path.name)
    return elapsed


def install_recording(nb: nbformat.NotebookNode, stem: str, recording: Path) -> str | None:
    """Put what the notebook recorded where the package reads it, with its code's digest. A notebook that
    recorded nothing on a machine that builds links has no recording (an old one is removed); on a machine that
    cannot, its runs were replays and its recording stays. Returns what was done, or None."""
    target = recorded.DIRECTORY / f"{stem}.json"
    if recording.is_file():
        runs = json.loads(recording.read_text())["runs"]
        kept = {"notebook": stem, "code_sha256": recorded.code_digest(nb), "runs": runs}
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(kept, indent=1) + "\n")
        return f"recorded {len(runs)} run(s) behind links"
    if not target.is_file():
        return None
    if netns_switch.why_unavailable() is None:
        target.unlink()
        return "no runs behind links any more: its recording is removed"
    return "no links can be built here: its runs behind links were replayed, and its recording stays as it was"


def existing_notebook(arg: str) -> Path:
    """An argument that names a notebook file that is there (argparse's ``type``)."""
    path = Path(arg)
    if path.suffix != ".ipynb" or not path.is_file():
        raise argparse.ArgumentTypeError(f"{arg}: no such notebook (a path to an .ipynb file)")
    return path


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_absolute() and path.is_relative_to(ROOT) else path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="save the executed copies here, leaving the committed ones")
    parser.add_argument("notebooks", nargs="*", type=existing_notebook, help="default: every numbered notebook")
    args = parser.parse_args(argv)
    out = args.out
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    executed, failed = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for path in paths:
            recording = Path(scratch) / f"{path.stem}.json"
            try:
                nb, elapsed = run(path, recording)
            except Exception as exc:  # every notebook still runs, so that one run names every failure
                failed.append(path)
                print(f"FAILED  {_shown(path)}: {type(exc).__name__}: {str(exc)[-2000:]}", flush=True)
                continue
            executed.append((path, nb, recording))
            print(f"{elapsed:6.1f} s  {_shown(path)}", flush=True)
        if failed:
            print(f"\n{len(failed)} of {len(paths)} notebooks failed: {', '.join(str(_shown(p)) for p in failed)}. "
                  "Nothing was written: every notebook and recording is as it was.", file=sys.stderr)  # fmt: skip
            return 1
        for path, nb, recording in executed:
            nbformat.write(nb, path if out is None else out / path.name)
            done = None if out is not None else install_recording(nb, path.stem, recording)
            if done:
                print(f"          {_shown(path)}: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

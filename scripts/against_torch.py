"""Run the suite and the notebooks against another torch, and say what changed: the table a torch upgrade needs.

    .venv/bin/python scripts/against_torch.py /path/to/other/venv [-n 1] [--no-tests] [--no-notebooks]

The other venv holds this checkout installed over another torch (README's command 1 with another pin; a CUDA
build, a newer release). Run from the reference venv, the script prints three parts:

- **tests**: ``pytest tests`` in the other venv: passed, failed, skipped, and each failure's name;
- **notebooks**: ``pytest notebooks --lab-tolerant`` there: cells passing the tolerant check, per notebook;
- **behaviours**: a probe run in both venvs: what DDP does with ``bf16_compress_hook`` (tried in a one-rank gloo
  group), the six fingerprint digests, and the main job's per-hook numbers (``python -m commhooks_lab``, 20 steps),
  each with both values and whether it changed.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The main job's columns compared per hook: every float of its table that a torch change could move.
MAIN_JOB_COLUMNS = ("rel_error", "cosine", "rank_spread", "payload_vs_fp32", "final_loss", "accuracy", "notes")


def interpreter(venv: Path) -> str:
    python = venv / "bin" / "python"
    if not python.is_file():
        raise SystemExit(f"{venv}: no bin/python there: give a venv's folder")
    where = subprocess.run(
        [str(python), "-c", "import commhooks_lab, torch; print(commhooks_lab.__file__); print(torch.__version__)"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if where.returncode != 0:
        raise SystemExit(f"{venv}: cannot import commhooks_lab and torch there:\n{where.stderr[-2000:]}")
    lab_file = Path(where.stdout.split()[0])
    if ROOT not in lab_file.parents:
        raise SystemExit(f"{venv} imports commhooks_lab from {lab_file}, not this checkout: pip install -e {ROOT}")
    return str(python)


# -- tests and notebooks ---------------------------------------------------------------------------------------


def pytest_in(python: str, targets: list[str], workers: int, extra: list[str]) -> tuple[ET.Element, float]:
    """pytest over ``targets`` in the other venv; its junit report and the seconds it took."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        command = [python, "-m", "pytest", *targets, "-q", "-n", str(workers), f"--junitxml={report}", *extra]
        start = time.monotonic()
        subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        elapsed = time.monotonic() - start
        if not report.exists():
            raise SystemExit(f"pytest wrote no report: run `{' '.join(command)}` to see why")
        return ET.parse(report).getroot(), elapsed


def outcomes(root: ET.Element) -> list[tuple[str, str, str]]:
    """``(file, test, passed|failed|skipped)`` for every test case of a junit report (an error counts as failed)."""
    out = []
    for case in root.iter("testcase"):
        where, name = case.get("classname", ""), case.get("name", "")
        if case.find("failure") is not None or case.find("error") is not None:
            out.append((where, name, "failed"))
        elif case.find("skipped") is not None:
            out.append((where, name, "skipped"))
        else:
            out.append((where, name, "passed"))
    return out


def tests_part(python: str, workers: int) -> list[str]:
    root, seconds = pytest_in(python, ["tests"], workers, [])
    results = outcomes(root)
    counts = Counter(outcome for _, _, outcome in results)
    lines = [
        f"tests: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
        f"({seconds:.0f} s, -n {workers})"
    ]
    lines += [f"  FAILED {where}::{name}" for where, name, outcome in results if outcome == "failed"]
    return lines


def notebooks_part(python: str, workers: int) -> list[str]:
    root, seconds = pytest_in(python, ["notebooks"], workers, ["--lab-tolerant"])
    per_notebook: dict[str, Counter] = defaultdict(Counter)
    failed: dict[str, list[str]] = defaultdict(list)
    for where, name, outcome in outcomes(root):
        notebook = where.removeprefix("notebooks.").removesuffix(".ipynb")
        per_notebook[notebook][outcome] += 1
        if outcome == "failed":
            failed[notebook].append(name.removeprefix("Cell "))
    lines = [f"notebooks, tolerant check (--lab-tolerant, {seconds:.0f} s, -n {workers}):"]
    for notebook, counts in sorted(per_notebook.items()):
        verdict = "passes" if counts["failed"] == 0 else "FAILS"
        cells = f" (cells {', '.join(failed[notebook])})" if failed[notebook] else ""
        lines.append(f"  {notebook:28} {verdict:6} {counts['passed']:3} cells passed, {counts['failed']} failed{cells}")
    return lines


# -- behaviours ------------------------------------------------------------------------------------------------


def probe(python: str) -> dict[str, str]:
    """What one venv does, flattened to ``{behaviour: value}``: the build, DDP's bf16 verdict, the fingerprint,
    the main job's per-hook numbers."""
    from commhooks_lab.launcher import fingerprint, torch_build

    seen = torch_build.in_child(executable=python)
    bf16 = seen["bf16"]
    found = {
        "torch": seen["build"]["torch"],
        "build": torch_build.describe(seen["build"]),
        "DDP register_comm_hook(bf16_compress_hook)": "accepted" if bf16["accepted"] else f"refused: {bf16['refusal']}",
    }
    digests = fingerprint.in_child(executable=python)
    found.update({f"fingerprint {part}": digest for part, digest in sorted(digests["parts"].items())})
    with tempfile.TemporaryDirectory() as out:
        command = [python, "-m", "commhooks_lab", "--steps", "20", "--quiet", "--no-figure", "--out", out]
        subprocess.run(command, cwd=ROOT, capture_output=True, check=True)
        with open(Path(out) / "summary.csv") as f:
            for row in csv.DictReader(f):
                for column in MAIN_JOB_COLUMNS:
                    found[f"main job {row['hook']} {column}"] = row.get(column, "")
    return found


def behaviours_part(reference: dict[str, str], other: dict[str, str]) -> list[str]:
    """Every behaviour that changed, with both values; the unchanged ones counted per group."""
    names = [name for name in dict.fromkeys([*reference, *other]) if name != "torch"]
    changed = [name for name in names if reference.get(name) != other.get(name)]
    left, right = f"torch {reference['torch']} (this venv)", f"torch {other['torch']}"
    lines = [f"behaviours that changed, {left} -> {right}:"]
    width = max(map(len, changed), default=0)
    for name in changed:
        lines.append(f"  {name:{width}}  {reference.get(name, '-')}")
        lines.append(f"  {'':{width}}  -> {other.get(name, '-')}")
    groups: dict[str, list[bool]] = defaultdict(list)
    for name in names:
        group = next((g for g in ("fingerprint", "main job") if name.startswith(g)), "DDP and build")
        groups[group].append(name not in changed)
    same = ", ".join(f"{group} {sum(kept)} of {len(kept)}" for group, kept in groups.items())
    lines.append(f"  unchanged: {same} ({len(changed)} of {len(names)} behaviours changed)")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("venv", type=Path, help="the other venv (this checkout installed over another torch)")
    parser.add_argument("-n", "--workers", type=int, default=1, help="pytest-xdist workers (default 1)")
    parser.add_argument("--no-tests", action="store_true", help="leave out the test suite")
    parser.add_argument("--no-notebooks", action="store_true", help="leave out the notebooks")
    args = parser.parse_args(argv)
    python = interpreter(args.venv)
    lines = behaviours_part(probe(sys.executable), probe(python))
    if not args.no_tests:
        lines += tests_part(python, args.workers)
    if not args.no_notebooks:
        lines += notebooks_part(python, args.workers)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

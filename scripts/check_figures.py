"""Check every figure the notebooks draw: text that collides, is cut off or hides data; axes that say too little.

    python scripts/check_figures.py [notebooks/04_powersgd.ipynb ...]

Runs each notebook in a clean kernel (as ``execute_notebooks.py --out`` does: the committed files
are left alone) with ``plt.show()`` checking every figure at its own size first
(``commhooks_lab.testing.figure_layout``), and prints one row per figure. Exits 1 if any figure has a
problem. The test suite makes the same check fail the notebook's cell under nbval.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from execute_notebooks import ROOT, execute  # noqa: E402

from commhooks_lab.testing.figure_layout import write_ipython_startup  # noqa: E402


def main(argv: list[str]) -> int:
    paths = [Path(p).resolve() for p in argv] or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        write_ipython_startup(Path(scratch) / "ipython")
        os.environ["IPYTHONDIR"] = str(Path(scratch) / "ipython")
        for path in paths:
            report = Path(scratch) / f"{path.stem}.jsonl"
            os.environ["COMMHOOKS_LAB_FIGURE_REPORT"] = str(report)
            execute(path, Path(scratch))
            lines = report.read_text().splitlines() if report.exists() else []
            rows += [(path.stem, json.loads(line)) for line in lines]
    bad = 0
    for notebook, record in rows:
        problems = record["problems"]
        bad += bool(problems)
        print(f"{notebook:34s} {record['figure'][:60]:62s} {'ok' if not problems else f'{len(problems)} problems'}")
        for problem in problems:
            print(f"{'':36s}- {problem}")
    print(f"{len(rows)} figures, {bad} with problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

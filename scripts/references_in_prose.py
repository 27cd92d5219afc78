"""List the file names, PR and issue numbers and source links that stand in a lesson's prose.

    python scripts/references_in_prose.py [notebooks/01_quickstart.ipynb ...]

Issue 32's rule for a textbook's voice: a section's prose explains; where a claim comes from (a PyTorch file,
a pull request, an issue, a line of source) goes into the short "Sources" list that closes the section: a
markdown cell that starts with ``**Sources**``. The "Further reading" section is a list of sources already.
Exits 1 and prints each reference found elsewhere, with its cell.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SOURCES_CELL = "**Sources**"
#: What counts as a reference: a Python file's name, a PR or issue number, a link into a code host.
REFERENCE = re.compile(r"[\w./-]+\.py\b|(?<![\w&])#\d{3,}\b|https?://github\.com/\S+|\bPR \d{3,}")
#: Left out: fenced code, and commands a reader is asked to run (`python bench/dashboard.py` is an instruction).
_NOT_PROSE = re.compile(r"```.*?```|`(?:python|pytest|\.venv/bin/)[^`]*`", re.S)


def references(nb: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """(cell index, reference) for every reference outside a Sources cell and the Further reading section."""
    found, reading = [], False
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        text = cell.source.lstrip()
        if text.startswith("## "):
            reading = text.startswith("## Further reading")
        if reading or text.startswith(SOURCES_CELL):
            continue
        found += [(index, match.group(0)) for match in REFERENCE.finditer(_NOT_PROSE.sub(" ", cell.source))]
    return found


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    paths = paths or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    total = 0
    for path in paths:
        found = references(nbformat.read(path, as_version=4))
        total += len(found)
        print(f"{path.name:42s} {len(found):4d}")
        for index, reference in found:
            print(f"    cell {index}: {reference}")
    print(f"{'all':42s} {total:4d}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())

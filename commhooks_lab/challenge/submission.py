"""A submission: a Python file that defines ``hook(state, bucket)`` (and, if its hook keeps state,
``make_state(process_group)``), or a notebook whose cells tagged ``challenge`` do. Read through
:mod:`commhooks_lab.safe_files`: a submission folder is handed around, and may hold a link or a FIFO."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..safe_files import parse_json, read_file

__all__ = ["MAX_SOURCE_BYTES", "Submission", "TAG", "read_submission", "submission_paths"]

#: The tag that marks a notebook's submission cells.
TAG = "challenge"
#: A hook is a page of code; a notebook with its outputs is larger.
MAX_SOURCE_BYTES = 256 * 1024
MAX_NOTEBOOK_BYTES = 8 * 1024 * 1024
#: The module name a submission runs under, in its own folder.
MODULE = "submission"


@dataclass(frozen=True)
class Submission:
    """A submission's name (its file's stem) and its source code."""

    label: str
    source: str

    @property
    def source_sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


def _notebook_source(data: bytes, path: Path) -> str:
    advice = "give a notebook saved by Jupyter"
    notebook = parse_json(data, path, advice)
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ValueError(f"{path}: not a notebook (no list of cells): {advice}")
    cells = []
    for cell in notebook["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        tags = (cell.get("metadata") or {}).get("tags") or []
        if TAG in tags:
            text = cell.get("source", "")
            cells.append("".join(text) if isinstance(text, list) else str(text))
    if not cells:
        raise ValueError(f"{path}: no code cell tagged {TAG!r}: tag the cell that defines hook(state, bucket)")
    return "\n\n".join(cells) + "\n"


def read_submission(path: str | Path) -> Submission:
    """The submission at ``path`` (``.py``, or ``.ipynb`` with cells tagged ``challenge``)."""
    path = Path(path)
    advice = "a submission is a .py file or a notebook, a regular file of its own"
    if path.suffix == ".ipynb":
        source = _notebook_source(read_file(path, MAX_NOTEBOOK_BYTES, advice), path)
    elif path.suffix == ".py":
        source = read_file(path, MAX_SOURCE_BYTES, advice).decode("utf-8", errors="replace")
    else:
        raise ValueError(f"{path}: not a .py file or a notebook")
    return Submission(path.stem, source)


def submission_paths(folder: str | Path) -> list[Path]:
    """The submissions in ``folder``, sorted by name (links and other kinds are read, and refused, one by one)."""
    return sorted(p for p in Path(folder).iterdir() if p.suffix in (".py", ".ipynb") and not p.name.startswith("."))

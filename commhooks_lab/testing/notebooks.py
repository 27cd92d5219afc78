"""Compare a notebook's outputs with its committed ones: strictly (nbval's rule) or within stated tolerances.

Tolerant comparison splits each output into its text and its numbers. The text (with runs of white space read
as one space, since a table pads its columns to the widest number) must be the same; integers must be equal;
every other number must satisfy ``|new - ref| <= atol + rtol * |ref|``, with the tolerance the notebook
states: ``metadata["commhooks_lab"]["tolerance"]`` of the notebook, overridden per cell by the cell's own,
each ``{"rtol": ..., "atol": ..., "why": ...}``. The plugin (:mod:`.plugin`) applies it under nbval; the
functions here work on two notebooks in memory, for scripts and tests.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = [
    "CellReport",
    "compare_notebooks",
    "compare_outputs",
    "compare_text",
    "compared_cells",
    "first_difference",
    "flatten",
    "is_integer",
    "METADATA_KEY",
    "Moved",
    "not_compared",
    "NUMBER",
    "STRICT",
    "Tolerance",
    "tolerance_of",
]

#: A number standing on its own: not part of a name (``fp16``, ``r4``, ``0x1f``), with sign, decimals, exponent.
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
#: What nbval never compares (its own list): volatile keys and images.
SKIP_KEYS = (
    "metadata",
    "traceback",
    "prompt_number",
    "output_type",
    "name",
    "execution_count",
    "application/vnd.jupyter.widget-view+json",
    "image/png",
    "image/jpeg",
)
METADATA_KEY = "commhooks_lab"


@dataclass(frozen=True)
class Tolerance:
    """How far a printed float may move: ``|new - ref| <= atol + rtol * |ref|``; ``why`` says what justifies it."""

    rtol: float = 0.0
    atol: float = 0.0
    why: str = ""
    #: Patterns (regular expressions) of text that may change from machine to machine, e.g. a digest of trained
    #: weights' bytes: tolerant mode reads each match as one placeholder. Strict mode still compares them.
    volatile: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"tolerance {name} must be a finite number >= 0, got {value!r}")

    def allows(self, ref: float, new: float) -> bool:
        return abs(new - ref) <= self.atol + self.rtol * abs(ref)


STRICT = Tolerance()


def tolerance_of(notebook_metadata: dict, cell_metadata: dict | None = None) -> Tolerance:
    """The tolerance a cell's numbers are held to: its own if it states one, else its notebook's, else none."""
    for metadata in (cell_metadata or {}, notebook_metadata):
        stated = metadata.get(METADATA_KEY, {}).get("tolerance")
        if stated is not None:
            unknown = set(stated) - {"rtol", "atol", "why", "measured", "volatile"}
            if unknown:
                raise ValueError(f"unknown tolerance fields {sorted(unknown)} (rtol, atol, why, measured, volatile)")
            volatile = tuple(stated.get("volatile", ()))
            for pattern in volatile:
                re.compile(pattern)
            return Tolerance(
                float(stated.get("rtol", 0.0)), float(stated.get("atol", 0.0)), stated.get("why", ""), volatile
            )
    return STRICT


@dataclass
class Moved:
    """One number that differs from the committed output: by how much, and whether the tolerance allows it."""

    ref: str
    new: str
    allowed: bool

    @property
    def relative(self) -> float:
        ref, new = float(self.ref), float(self.new)
        if ref == new:
            return 0.0
        return abs(new - ref) / abs(ref) if ref else math.inf


@dataclass
class CellReport:
    """What one cell's outputs did against the committed ones."""

    cell: int
    same: bool  # passes under the tolerance it was compared with
    problem: str = ""  # why it does not: a text, integer or count difference, or numbers beyond the tolerance
    moved: list[Moved] = field(default_factory=list)  # every number that changed, allowed or not

    @property
    def largest_relative_move(self) -> float:
        return max((m.relative for m in self.moved), default=0.0)


def _split_numbers(text: str) -> tuple[list[str], list[str]]:
    """``text`` as its skeleton (white space folded) and its numbers, in order."""
    pieces = NUMBER.split(text)
    numbers = NUMBER.findall(text)
    return [re.sub(r"\s+", " ", piece) for piece in pieces], numbers


def is_integer(token: str) -> bool:
    """Is this number token an integer (a count, a byte total), which tolerant checks compare exactly?"""
    return not any(c in token for c in ".eE")


def first_difference(ref: str, new: str, before: int = 20, width: int = 80) -> tuple[str, str]:
    """Both texts from a little before the first character where they differ (white space folded), ``width``
    characters each: what a report shows, so the two sides it prints are never the same text."""
    ref, new = re.sub(r"\s+", " ", ref), re.sub(r"\s+", " ", new)
    where = next((i for i, (a, b) in enumerate(zip(ref, new)) if a != b), min(len(ref), len(new)))
    start = max(0, where - before)
    cut = "…" if start else ""
    return cut + ref[start : start + width], cut + new[start : start + width]


def compare_text(ref: str, new: str, tolerance: Tolerance) -> tuple[str, list[Moved]]:
    """(problem, moved numbers): problem is empty when ``new`` matches ``ref`` under ``tolerance``.

    Under :data:`STRICT` any difference is a problem; the numbers that moved are listed all the same.
    """
    if ref == new:
        return "", []
    for pattern in tolerance.volatile:
        ref, new = re.sub(pattern, "<volatile>", ref), re.sub(pattern, "<volatile>", new)
    ref_text, ref_numbers = _split_numbers(ref)
    new_text, new_numbers = _split_numbers(new)
    if ref_text != new_text or len(ref_numbers) != len(new_numbers):
        a, b = first_difference(NUMBER.sub("<n>", ref), NUMBER.sub("<n>", new))
        return f"the text differs, not just numbers: {a!r} became {b!r}", []
    moved, problems = [], []
    for a, b in zip(ref_numbers, new_numbers):
        if a == b:
            continue
        if is_integer(a) and is_integer(b):
            moved.append(Moved(a, b, False))
            problems.append(f"integer {a} became {b} (integers must match exactly)")
            continue
        allowed = tolerance.allows(float(a), float(b))
        moved.append(Moved(a, b, allowed))
        if not allowed:
            problems.append(f"{a} became {b} (relative change {moved[-1].relative:.2g})")
    if tolerance == STRICT:
        return "the output differs (strict): " + "; ".join(f"{m.ref} became {m.new}" for m in moved[:5]), moved
    if problems:
        limit = f"rtol={tolerance.rtol:g}, atol={tolerance.atol:g}"
        return f"beyond the tolerance ({limit}): " + "; ".join(problems[:5]), moved
    return "", moved


def flatten(outputs: list[dict], sanitize: Callable[[str], str]) -> dict[str, list]:
    """Outputs as nbval compares them: every field (a rich output's MIME types flattened) to its values in order."""
    flat: dict[str, list] = defaultdict(list)
    for output in _merge_streams(outputs):
        for key, value in output.items():
            if key in SKIP_KEYS:
                continue
            if key == "data":
                for mime, data in value.items():
                    if mime not in SKIP_KEYS:
                        flat[mime].append(_sanitized(data, sanitize))
            else:
                flat[key].append(_sanitized(value, sanitize))
    return dict(flat)


def _sanitized(value, sanitize: Callable[[str], str]):
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = "".join(value)
    return sanitize(value) if isinstance(value, str) else value


def _merge_streams(outputs: list[dict]) -> list[dict]:
    """nbval's rule: consecutive stream outputs of one name are one output; stderr and stdout kept apart."""
    import nbformat
    from nbval.plugin import coalesce_streams, transform_streams_for_comparison

    joined = [nbformat.from_dict({k: _sanitized(v, str) if k == "text" else v for k, v in o.items()}) for o in outputs]
    return transform_streams_for_comparison(coalesce_streams(joined))


def compare_outputs(
    ref: list[dict], new: list[dict], tolerance: Tolerance, sanitize: Callable[[str], str], cell: int = -1
) -> CellReport:
    """One cell: ``new`` outputs against the committed ``ref`` ones."""
    ref_flat, new_flat = flatten(ref, sanitize), flatten(new, sanitize)
    if set(ref_flat) != set(new_flat):
        return CellReport(cell, False, f"output fields {sorted(ref_flat)} became {sorted(new_flat)}")
    moved: list[Moved] = []
    for key, ref_values in ref_flat.items():
        new_values = new_flat[key]
        if len(ref_values) != len(new_values):
            return CellReport(cell, False, f"{len(ref_values)} {key} outputs became {len(new_values)}")
        for a, b in zip(ref_values, new_values):
            if isinstance(a, str) and isinstance(b, str):
                problem, cell_moved = compare_text(a, b, tolerance)
            else:
                problem, cell_moved = ("" if a == b else f"{key} differs"), []
            moved += cell_moved
            if problem:
                return CellReport(cell, False, f"{key}: {problem}", moved)
    return CellReport(cell, True, "", moved)


def sanitizer(path: str | None = None) -> Callable[[str], str]:
    """The sanitize rules of an nbval sanitize file (the lab's own by default) as one function."""
    from nbval.plugin import get_sanitize_patterns

    if path is None:
        from . import sanitize_file

        path = str(sanitize_file())
    with open(path) as f:
        patterns = get_sanitize_patterns(f.read())

    def sanitize(text: str) -> str:
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text

    return sanitize


def not_compared(cell: dict) -> bool:
    """Is this code cell one strict nbval does not compare? Read with nbval's own parsers, so that its rule holds
    here: the tags ``nbval-ignore-output``/``nbval-skip`` (the course's way: a reader never sees them), or a
    comment line ``# NBVAL_IGNORE_OUTPUT``/``# NBVAL_SKIP``, which wins over a tag as in nbval."""
    import warnings

    from nbval.plugin import find_comment_markers, find_metadata_tags

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nbval warns of conflicting markers when it collects the cell
        options = dict(find_metadata_tags(cell.get("metadata", {})))
        options.update(find_comment_markers("".join(cell.get("source", ""))))
    return bool(options.get("skip", False)) or not options.get("check", True)


def compare_notebooks(
    ref: dict,
    new: dict,
    tolerant: bool,
    sanitize: Callable[[str], str] | None = None,
    tolerance_for: Callable[[dict, dict], Tolerance] | None = None,
) -> list[CellReport]:
    """Every checked code cell of ``new`` against ``ref`` (numbered as nbval numbers them): a list of CellReport.

    ``tolerant=False`` is nbval's strict rule; ``True`` holds each cell to :func:`tolerance_of` (or to
    ``tolerance_for(notebook_metadata, cell_metadata)``).
    """
    sanitize = sanitize or sanitizer()
    tolerance_for = tolerance_for or tolerance_of
    reports = []
    for number, a, b in compared_cells(ref, new):
        tolerance = tolerance_for(ref.get("metadata", {}), a.get("metadata", {})) if tolerant else STRICT
        reports.append(compare_outputs(a["outputs"], b["outputs"], tolerance, sanitize, cell=number))
    return reports


def compared_cells(ref: dict, new: dict) -> Iterator[tuple[int, dict, dict]]:
    """``(number, ref cell, new cell)`` for each code cell nbval compares, numbered as nbval numbers them."""
    ref_cells = [c for c in ref["cells"] if c["cell_type"] == "code"]
    new_cells = [c for c in new["cells"] if c["cell_type"] == "code"]
    if len(ref_cells) != len(new_cells):
        raise ValueError(f"{len(ref_cells)} code cells became {len(new_cells)}: not the same notebook")
    for number, (a, b) in enumerate(zip(ref_cells, new_cells)):
        if not not_compared(a):
            yield number, a, b

"""Pin a hook's behaviour across torch upgrades: a Result against a saved one, bytes exact, floats within tolerances."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..result import Result, load

__all__ = ["assert_matches_golden", "compare_with_golden", "DEFAULT_RTOL", "EXACT_COLUMNS", "Moved"]

#: Bytes must not move at all; errors and losses may move by float rounding of another build.
EXACT_COLUMNS = ("payload_bytes", "uncompressed_bytes", "compressing")
DEFAULT_RTOL = {"rel_error": 1e-3, "cosine": 1e-6, "loss": 1e-4, "cumulative_rel_error": 1e-3}


@dataclass
class Moved:
    """One number that differs from the golden result beyond its tolerance."""

    column: str
    step: int
    golden: float
    now: float

    def __str__(self) -> str:
        return f"{self.column} at step {self.step}: {self.golden!r} -> {self.now!r}"


def compare_with_golden(result: Result, golden: Result, rtol: dict[str, float] | None = None) -> list[Moved]:
    """Every number of ``result.steps`` that moved beyond its tolerance (exact columns: any change)."""
    tolerances = {**DEFAULT_RTOL, **(rtol or {})}
    if len(result.steps) != len(golden.steps):
        return [Moved("steps", -1, float(len(golden.steps)), float(len(result.steps)))]
    moved = []
    for column in (*EXACT_COLUMNS, *tolerances):
        if column not in golden.steps:
            continue
        if column not in result.steps:
            moved.append(Moved(column, -1, math.nan, math.nan))
            continue
        for step, (old, new) in enumerate(zip(golden.steps[column], result.steps[column])):
            old, new = float(old), float(new)
            same = old == new if column in EXACT_COLUMNS else math.isclose(old, new, rel_tol=tolerances[column])
            if not same and not (math.isnan(old) and math.isnan(new)):
                moved.append(Moved(column, step, old, new))
    return moved


def assert_matches_golden(result: Result, path, rtol: dict[str, float] | None = None, update: bool = False) -> None:
    """Compare ``result`` with the golden file at ``path``; write it first if it does not exist (or ``update``).

    Raises AssertionError listing every number that moved, with its tolerance policy.
    """
    path = Path(path)
    if update or not path.exists():
        result.save(path)
        return
    golden = load(path)
    assert isinstance(golden, Result), f"{path} holds a folder of results, not one"
    moved = compare_with_golden(result, golden, rtol)
    if moved:
        tolerances = {**DEFAULT_RTOL, **(rtol or {})}
        lines = "\n".join(f"  - {m}" for m in moved[:20]) + (
            f"\n  ... {len(moved) - 20} more" if len(moved) > 20 else ""
        )
        raise AssertionError(
            f"{result.name} moved from {path} ({len(moved)} numbers; bytes must match exactly, relative tolerances "
            f"{tolerances}):\n{lines}"
        )

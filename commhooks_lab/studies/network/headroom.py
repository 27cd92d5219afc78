"""How much slower each run's step is than a reference run's, from measured step times."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from ...result import Result

__all__ = ["headroom"]


def headroom(results: Iterable[Result], reference: str = "no", skip: int = 5) -> pd.DataFrame:
    """Median step time of each run (first ``skip`` steps left out: warm-up), and its change vs ``reference``."""
    runs = {r.name: r for r in results}
    if reference not in runs:
        raise ValueError(f"headroom needs a run named {reference!r} to compare with")
    median_ms = {name: 1e3 * r.steps["step_time_s"].iloc[skip:].median() for name, r in runs.items()}
    table = pd.DataFrame({"median_step_ms": median_ms})
    table[f"vs_{reference}"] = table["median_step_ms"] / median_ms[reference] - 1
    return table

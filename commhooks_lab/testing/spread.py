"""The rule that turns a measured spread into a stated tolerance, shared by ``scripts/measure_spread.py`` and tests.

A cell's numbers are run on several kernel paths (native numerics); the largest relative move (and, for numbers
whose committed value is 0, the largest absolute one) times :data:`SAFETY`, rounded up to one significant figure,
is the tolerance the cell states. Where that relative tolerance would exceed :data:`MAX_RTOL` (small numbers
near 0, statistics of a few seeds), the cell states an absolute one instead: the largest absolute move, times
:data:`SAFETY`. Nothing is chosen to pass: a test recomputes each stated tolerance from the
measurement stored beside it.
"""

from __future__ import annotations

import math

__all__ = ["needed", "SAFETY", "SEED_SET", "tolerance_from"]

SAFETY = 2.0
MAX_RTOL = 0.5
#: The configurations a measurement runs besides the kernel paths; they inform, they do not set tolerances.
SEED_SET = "seed set 1"


def _round_up(value: float) -> float:
    """``value`` rounded up to one significant figure (0.00237 -> 0.003)."""
    if value <= 0:
        return 0.0
    exponent = math.floor(math.log10(value))
    return float(f"{math.ceil(value / 10**exponent * (1 - 1e-12)) * 10.0**exponent:.1g}")


def needed(moves: list[tuple[float, float]]) -> dict[str, float]:
    """What (committed, new) number pairs need: the largest relative move (of numbers not committed as 0), the
    largest absolute move of those committed as 0, and the largest absolute move of all."""
    return {
        "rtol": max((abs(b - a) / abs(a) for a, b in moves if a != 0), default=0.0),
        "atol": max((abs(b) for a, b in moves if a == 0), default=0.0),
        "abs": max((abs(b - a) for a, b in moves), default=0.0),
    }


def tolerance_from(measured: dict[str, dict[str, float]]) -> tuple[float, float]:
    """(rtol, atol) for the moves ``measured`` on each kernel path (``{path: needed(...)}``)."""
    kernel = [m for name, m in measured.items() if name != SEED_SET]
    rtol = _round_up(SAFETY * max((m["rtol"] for m in kernel), default=0.0))
    if rtol <= MAX_RTOL:
        return rtol, _round_up(SAFETY * max((m["atol"] for m in kernel), default=0.0))
    return 0.0, _round_up(SAFETY * max((m["abs"] for m in kernel), default=0.0))

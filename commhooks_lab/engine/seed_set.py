"""The seed set: ``COMMHOOKS_LAB_SEED_SET=k`` shifts every task seed by ``1000 * k`` (weights, data split, data
order), so that a notebook re-run under another seed set shows which of its conclusions outlive the seeds it was
written with. A module without torch: the challenge's sandbox reads the variable's name before any score runs."""

from __future__ import annotations

import os

__all__ = ["SEED_SET_STRIDE", "SEED_SET_VARIABLE", "effective_seed"]

SEED_SET_VARIABLE = "COMMHOOKS_LAB_SEED_SET"
SEED_SET_STRIDE = 1000


def effective_seed(seed: int) -> int:
    """The seed a task and its data really use: ``seed`` shifted by the seed set (0 unless one is chosen)."""
    value = os.environ.get(SEED_SET_VARIABLE, "0").strip() or "0"
    if not value.isdigit():
        raise ValueError(f"{SEED_SET_VARIABLE}={value!r}: use a whole number >= 0 (0 is the notebooks' own seeds)")
    return seed + SEED_SET_STRIDE * int(value)

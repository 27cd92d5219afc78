"""PyTorch's debugging hook (``debugging_hooks.py``): ``noop``, no communication at all (the headroom test)."""

from __future__ import annotations

from typing import Any

from .default import READS_BUCKET
from .registry import HOOK, HookEntry, register
from .traffic import allreduced

__all__: list[str] = []


def _build_noop(options: dict, process_group: Any) -> tuple:
    from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks

    return debugging_hooks.noop_hook, process_group


register(
    HookEntry(
        "noop",
        HOOK,
        "no communication: every rank keeps its own gradient (breaks DDP's invariant)",
        build=_build_noop,
        not_compilable=READS_BUCKET.format("noop_hook"),
        traffic=lambda shapes, buckets, options: allreduced(0, 0),
    )
)

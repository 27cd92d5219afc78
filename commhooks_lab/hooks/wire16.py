"""The lab's 16-bit ring hooks (:mod:`.low_precision`) as registry records: ``ring16`` and ``wire16_sum32``.

No byte rule: their sends are point-to-point ring hops, not one collective, so the network model's
all-reduce terms do not describe them (notebook 10 uses them for rounding, not bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import HOOK, Builder, HookEntry, register

__all__: list[str] = []


def _build_wire16(attribute: str) -> Builder:
    def build(options: dict, process_group: Any) -> tuple:
        import torch

        from . import low_precision

        dtype = getattr(torch, options.get("dtype", "bfloat16"))
        return getattr(low_precision, attribute), low_precision.Wire16State(dtype, process_group)

    return build


def _check_wire16_dtype(options: dict) -> None:
    if options.get("dtype", "bfloat16") not in ("bfloat16", "float16"):
        raise ValueError(f"dtype must be 'bfloat16' or 'float16' (the format on the wire), got {options['dtype']!r}")


def _dtype_run_name(name: str) -> Callable[[dict], str]:
    def run_name(options: dict) -> str:
        return f"{name} {options.get('dtype', 'bfloat16')}"

    return run_name


for _name, _attribute, _summary in (
    ("ring16", "ring_hook", "the bf16/fp16 hook's arithmetic summed hop by hop on a ring, as NCCL rounds it"),
    (
        "wire16_sum32",
        "wire16_sum32_hook",
        "16-bit values on the wire, float32 sums: the ring's bytes, an error that stays flat as ranks are added",
    ),
):
    register(
        HookEntry(
            _name,
            HOOK,
            _summary,
            build=_build_wire16(_attribute),
            defaults=lambda: {"dtype": "bfloat16"},
            check=_check_wire16_dtype,
            run_name=_dtype_run_name(_name),
        )
    )

"""Other machines, simulated on this one: the kernel paths another x86-64 CPU would take under native numerics.

Each path names what ATen, MKL and oneDNN would pick there (one thread, as the ranks run), so notebooks can be
executed as that machine would execute them: ``avx2`` is a Haswell-to-Zen laptop, ``sse4_2`` a pre-2013 CPU, and
``native`` this CPU's own choice. The first two give the same bits on any CPU that can run them (AVX2 or
better), which is what lets CI check them; ``native`` differs from machine to machine.
"""

from __future__ import annotations

import os

from ..launcher.numerics import MODE_VARIABLE, NATIVE, ONE_THREAD, PORTABLE_VARIABLES

__all__ = ["environment", "KERNEL_PATHS", "PORTABLE_PATHS"]

KERNEL_PATHS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "sse4_2": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
#: What CI checks: the paths whose bits do not depend on the CPU underneath.
PORTABLE_PATHS = ("avx2", "sse4_2")


def environment(path: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (``os.environ``) as a process on kernel path ``path`` needs it: native numerics, that path's picks."""
    if path not in KERNEL_PATHS:
        raise ValueError(f"unknown kernel path {path!r}; choose one of {sorted(KERNEL_PATHS)}")
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in PORTABLE_VARIABLES}
    return {**env, MODE_VARIABLE: NATIVE, **ONE_THREAD, **KERNEL_PATHS[path]}

"""Portable numerics: the same bits from the lab on every x86-64 CPU, so committed notebook outputs hold elsewhere.

PyTorch's CPU build picks code paths by the CPU it runs on: ATen dispatches its kernels on the CPU's SIMD
level (``ATEN_CPU_CAPABILITY``: avx512, avx2 or default), MKL picks its GEMM and LAPACK code by CPU
(``MKL_CBWR`` pins one), oneDNN JIT-compiles convolutions for the CPU (``ONEDNN_MAX_CPU_ISA`` caps it), and
parallel reductions split their work by thread count. Each choice changes the last bits of a float; training
compounds them (a 20-step fp16 run's ``rel_error`` 2.827397e-04 on one CPU, 2.831110e-04 on another).

``portable`` (the default) pins all four in every process the lab starts (ranks, rank servers, helper
children) and, from ``import commhooks_lab`` on, in this process too. ``native`` (``COMMHOOKS_LAB_NUMERICS=native``
before the import) leaves every choice to the machine: faster kernels, machine-specific bits.

Portable numerics have two tiers, because each setting is a ceiling. Every CPU with AVX2 (Intel since Haswell,
2013; AMD since Excavator, 2015, and every Zen) runs ATen's AVX2 kernels and oneDNN's AVX2 code, with MKL's
CPU-independent path: one set of bits, measured the same on this Intel host (AVX-512 capped) and on qemu's Intel
Haswell and AMD EPYC models. A CPU without AVX2 falls to ATen's plain C++ kernels and oneDNN's SSE4.1 code, which
give other bits (the same on every such CPU). The committed notebook outputs are the AVX2 tier's; the older tier
(what the lab pinned everywhere before, about 1.7-2x slower on the CNN) checks them with ``--lab-tolerant``.

What it cannot make portable: another architecture (Apple silicon, aarch64: other kernels and BLAS), another
build of PyTorch (conda-forge's: other compilers, possibly OpenBLAS), another PyTorch version. There a
regression check needs tolerances (:mod:`commhooks_lab.testing`). Stdlib only: it runs before torch loads.
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = [
    "apply_here",
    "describe",
    "mode",
    "MODE_VARIABLE",
    "MODES",
    "ONE_THREAD",
    "PORTABLE_VARIABLES",
    "TIERS",
    "variables",
]

MODE_VARIABLE = "COMMHOOKS_LAB_NUMERICS"
PORTABLE, NATIVE = "portable", "native"
MODES = (PORTABLE, NATIVE)

#: What portable numerics sets, and why (each read by its library lazily: before the first operation is enough).
PORTABLE_VARIABLES = {
    "ATEN_CPU_CAPABILITY": "avx2",  # ATen's AVX2 kernels (AVX-512 CPUs capped; plain C++ where there is no AVX2)
    "MKL_CBWR": "COMPATIBLE",  # MKL's conditional numerical reproducibility: one code path for every CPU
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN's convolutions JIT-compiled for AVX2 at most (SSE4.1 where no AVX2)
}
#: ATen's kernels in each tier of portable numerics (torch.backends.cpu.get_cpu_capability()): the tier's name.
TIERS = {"AVX2": "avx2", "DEFAULT": "pre-avx2"}
#: One thread: a parallel reduction's order depends on the thread count (a 4M-element sum and a 512x512 matmul
#: differ between 1 and 2 threads), and a laptop's cores are shared by the ranks anyway.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def mode() -> str:
    """``portable`` or ``native``, from ``COMMHOOKS_LAB_NUMERICS`` (portable when unset)."""
    value = os.environ.get(MODE_VARIABLE, PORTABLE).strip().lower() or PORTABLE
    if value not in MODES:
        raise ValueError(f"{MODE_VARIABLE}={os.environ[MODE_VARIABLE]!r}: use one of {', '.join(MODES)}")
    return value


def variables(numerics: str | None = None) -> dict[str, str]:
    """The variables a process must have before its first torch operation for ``numerics`` (default: :func:`mode`)."""
    chosen = mode() if numerics is None else numerics
    if chosen not in MODES:
        raise ValueError(f"numerics={numerics!r}: use one of {', '.join(MODES)}")
    return dict(PORTABLE_VARIABLES) if chosen == PORTABLE else {}


def apply_here() -> list[str]:
    """Make this process portable (in portable mode): set the variables, and one torch thread if torch is loaded.

    Returns what could not take effect any more: ATen fixes its kernel choice at the first operation, so a
    process that ran torch before ``import commhooks_lab`` keeps the CPU's own kernels (:func:`describe` says so).
    """
    try:
        wanted = variables()
    except ValueError as exc:  # the package still imports; every run is refused, with this message, before it starts
        warnings.warn(f"{exc}; every run is refused until it is fixed", RuntimeWarning, stacklevel=2)
        return [str(exc)]
    if not wanted:
        return []
    os.environ.update(wanted)
    late = []
    torch = _torch_if_loaded()
    if torch is None:
        os.environ.update(ONE_THREAD)  # read when torch loads
    else:
        torch.set_num_threads(1)
        late = [line for line in _mismatches(torch) if line]
    return late


def _torch_if_loaded():
    """torch if this process has imported it (waiting for an import under way in another thread), else None."""
    if "torch" not in sys.modules:
        return None
    import torch  # blocks on the module's import lock until a background import has finished

    return torch


def _mismatches(torch) -> list[str]:
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in TIERS:
        return [
            f"ATen already runs its {capability} kernels in this process (torch ran before commhooks_lab was "
            "imported): import commhooks_lab first, or restart the kernel"
        ]
    return []


def describe() -> dict[str, object]:
    """This process's numerics: the mode, the variables in force, ATen's kernels, torch's threads, and any problem."""
    info: dict[str, object] = {"mode": mode()}
    info.update({name: os.environ.get(name) for name in (*PORTABLE_VARIABLES, *ONE_THREAD)})
    torch = _torch_if_loaded()
    if torch is not None:
        info["aten_kernels"] = torch.backends.cpu.get_cpu_capability()
        info["threads"] = torch.get_num_threads()
        if mode() == PORTABLE:
            info["tier"] = TIERS.get(str(info["aten_kernels"]), "none (torch ran before the import)")
        problems = _mismatches(torch) if mode() == PORTABLE else []
        if mode() == PORTABLE and torch.get_num_threads() != 1:
            problems.append(f"torch uses {torch.get_num_threads()} threads here (portable numerics needs 1)")
        info["problems"] = problems
    return info

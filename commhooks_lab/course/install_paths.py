"""Where an install's exact versions come from, and the two ways to get torch: facts shared by the set-up script,
the README and ``doctor``.

Standard library only, and nothing imported from the package: ``scripts/setup_venv.py`` loads this file by path
with the learner's system Python, before anything is installed.
"""

from __future__ import annotations

# The Pythons ``requires-python`` allows, each with its own lock (constraints/py3.X.txt): numpy, pandas, ipython,
# Sphinx ... have dropped 3.10, so one set of exact versions cannot serve them all.
SUPPORTED_PYTHONS = ((3, 10), (3, 11), (3, 12), (3, 13))
# The committed notebook outputs were made on this Python; its lock is the reference the others were resolved from.
MAIN_PYTHON = (3, 11)
LOCK_FOLDER = "constraints"
EXTRAS = ".[test,accelerate]"

SETUP_COMMAND = "python3 scripts/setup_venv.py"
CPU_SETUP_COMMAND = "python3 scripts/setup_venv.py --cpu"
# PyTorch's own index of CPU-only wheels (torch==X+cpu): no CUDA libraries. The rest still comes from PyPI.
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# Measured 2026-12-07 on Linux x86-64 with scripts/setup_venv.py. PyPI's torch 2.13.0 is a CUDA build on Linux for
# every Python: pip downloaded its wheel and the 20 nvidia-*, cuda-* and triton wheels it pins, 2733 MB on Python
# 3.11.2, 3.12.1 and 3.13.0 alike (3003 MB with everything else); the venv took 5.7-5.8 GB (du -sh). The CPU build
# is one wheel (torch-2.13.0+cpu-cp311: 191.8 MB); its venv took 2.0 GB (3.11.7, as root and as a learner).
DEFAULT_TORCH_DOWNLOAD = "2.7 GB"
CPU_TORCH_DOWNLOAD = "192 MB"
DEFAULT_VENV_SIZE = "5.8 GB"
CPU_VENV_SIZE = "2.0 GB"


def lock_for(version: tuple[int, ...]) -> str:
    """The constraints file for this Python, relative to the repository root."""
    return f"{LOCK_FOLDER}/py{version[0]}.{version[1]}.txt"


def supported(version: tuple[int, ...]) -> bool:
    return tuple(version[:2]) in SUPPORTED_PYTHONS


def supported_range() -> str:
    first, last = SUPPORTED_PYTHONS[0], SUPPORTED_PYTHONS[-1]
    return f"{first[0]}.{first[1]}-{last[0]}.{last[1]}"


def cpu_only_advice() -> str:
    """What ``doctor`` says beside a CUDA build of torch on a machine that only needs its CPU."""
    return (
        f"for a CPU-only install: rm -rf .venv && {CPU_SETUP_COMMAND} (torch's CPU build from {CPU_INDEX}: "
        f"{CPU_TORCH_DOWNLOAD} to download, a {CPU_VENV_SIZE} venv; the default CUDA build downloads "
        f"{DEFAULT_TORCH_DOWNLOAD}, a {DEFAULT_VENV_SIZE} venv)"
    )

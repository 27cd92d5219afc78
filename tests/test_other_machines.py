"""The notebooks on other machines, simulated here: native numerics on other kernel paths pass the tolerant check.

Strict nbval (the README's test command) holds on any x86-64 CPU because portable numerics pin the kernels. A
machine that runs native numerics (``COMMHOOKS_LAB_NUMERICS=native``) takes its CPU's own kernels and gets other
last bits; what it can still check is the tolerant comparison: numbers within the tolerances each notebook states
(measured with ``scripts/measure_spread.py``), text and integers exactly. The test executes half of the notebooks,
the other half the next day (``notebooks_to_check``), as such a machine would (``commhooks_lab.testing.machines``:
AVX2 kernels, or a pre-AVX2 CPU's, alternating), both paths at once (a notebook keeps two cores about 40% busy),
and runs that check on each.
"""

import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commhooks_lab.testing import machines

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


ALL_NOTEBOOKS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.ipynb"))
#: Which half of the notebooks a run checks: ``0`` or ``1``, or ``all``. Unset, the half changes every day, so that
#: CI, which has 20 minutes for everything, checks every notebook on another kernel path every two days (re-running
#: the whole course a second time took 184-282 s of a 630-815 s suite). Every notebook on every path is what
#: ``scripts/measure_spread.py`` measures, and the tolerances come from that.
HALF_VARIABLE = "COMMHOOKS_LAB_OTHER_MACHINES_HALF"


def notebooks_to_check() -> list[str]:
    half = os.environ.get(HALF_VARIABLE, str(datetime.date.today().toordinal() % 2))
    if half == "all":
        return ALL_NOTEBOOKS
    if half not in ("0", "1"):
        raise ValueError(f"{HALF_VARIABLE}={half!r}: use 0, 1 or all")
    return ALL_NOTEBOOKS[int(half) :: 2]


def test_the_halves_cover_every_notebook(monkeypatch):
    halves = []
    for half in ("0", "1"):
        monkeypatch.setenv(HALF_VARIABLE, half)
        halves.append(notebooks_to_check())
    assert sorted(halves[0] + halves[1]) == ALL_NOTEBOOKS and not set(halves[0]) & set(halves[1])


def test_the_notebooks_pass_the_tolerant_check_on_two_other_kernel_paths():
    notebooks = notebooks_to_check()
    share = {path: notebooks[i :: len(machines.PORTABLE_PATHS)] for i, path in enumerate(machines.PORTABLE_PATHS)}
    assert sorted(n for names in share.values() for n in names) == notebooks
    runs = {
        path: subprocess.Popen(
            [sys.executable, "-m", "pytest", *share[path], "-q", "--lab-tolerant"],
            cwd=ROOT,
            env=machines.environment(path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for path in machines.PORTABLE_PATHS
    }
    outputs = {}
    try:
        for path, run in runs.items():
            outputs[path] = run.communicate(timeout=900)[0]
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
                run.wait()
    for path, run in runs.items():
        assert run.returncode == 0, f"kernel path {path}:\n" + outputs[path][-6000:]
        assert "numbers that moved (--lab-tolerant)" in outputs[path], "the tolerant plugin did not run"

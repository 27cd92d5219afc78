"""The notebooks on other machines, simulated here: native numerics on other kernel paths pass the tolerant check.

Strict nbval (the README's test command) holds on any x86-64 CPU because portable numerics pin the kernels. A
machine that runs native numerics (``COMMHOOKS_LAB_NUMERICS=native``) takes its CPU's own kernels and gets other
last bits; what it can still check is the tolerant comparison: numbers within the tolerances each notebook states
(measured with ``scripts/measure_spread.py``), text and integers exactly. The test executes every notebook as
such a machine would (``commhooks_lab.testing.machines``: AVX2 kernels, or a pre-AVX2 CPU's, alternating), both
paths at once (a notebook keeps two cores about 40% busy), and runs that check on each.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from commhooks_lab.testing import machines

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


#: Each notebook on one of the two paths, alternating, so that CI stays within its time (every notebook on every
#: path is what ``scripts/measure_spread.py`` measures, and the tolerances come from that).
NOTEBOOKS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_the_notebooks_pass_the_tolerant_check_on_two_other_kernel_paths():
    share = {path: NOTEBOOKS[i :: len(machines.PORTABLE_PATHS)] for i, path in enumerate(machines.PORTABLE_PATHS)}
    assert sorted(n for names in share.values() for n in names) == NOTEBOOKS
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

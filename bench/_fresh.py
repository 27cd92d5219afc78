"""Time code in fresh interpreters, as a learner's first cell in a new kernel meets it.

Each snippet runs in a new ``python -c`` process and prints one number: the seconds it measured
itself, from its first line (before any import) to the end of the work. Snippets are interleaved
(a, b, c, a, b, c, ...) so that machine noise hits all alike; failed runs are counted, not timed.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap

#: The ranks' threads, as the lab sets them (every variant's ranks see the same), and the import prewarming
#: as it does in a notebook kernel (a script does not).
CHILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "COMMHOOKS_LAB_PREWARM": "1"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(code: str, timeout_s: float = 300) -> tuple[float | None, str]:
    """(seconds the snippet reported, '' if fine or why it failed)."""
    env = {**os.environ, **CHILD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    try:
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            cwd=ROOT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, "timeout"
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        last = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        return None, last[:80]
    return float(lines[-1]), ""


def time_fresh(snippets: dict[str, str], repeats: int) -> dict[str, dict]:
    """{name: {"times": [...], "failures": [...]}} over ``repeats`` fresh interpreters each, interleaved."""
    out: dict[str, dict] = {name: {"times": [], "failures": []} for name in snippets}
    for _ in range(repeats):
        for name, code in snippets.items():
            seconds, why = run_once(code)
            if seconds is None:
                out[name]["failures"].append(why)
            else:
                out[name]["times"].append(seconds)
    return out


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def cell(value: float | None, width: int, digits: int = 3) -> str:
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"

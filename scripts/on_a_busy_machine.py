"""Run tests on this machine made about FACTOR times slower: busy loops share every core with them.

    python scripts/on_a_busy_machine.py [--factor 3] [pytest arguments ...]

A learner's laptop running a browser and a video call is such a machine. Each core gets ``FACTOR - 1``
busy processes at the tests' own priority, each in a session of its own: Linux's autogroup scheduler shares the
CPU between sessions first, so busy loops in one session would slow a notebook kernel (a session of its own) at
most twofold. The slowdown is measured, not assumed: a fixed loop, timed in a new session before and under the
load. Without
pytest arguments it runs what timed out there before: every notebook under nbval, the compile matrix and
both browser tests (``pytest -n 2``, as README command 2 does). Prints the load, the wall time and pytest's
slowest durations, and exits with pytest's status. The busy loops are this script's children, ended by PID.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TESTS = ["notebooks", "tests/multiprocess/test_compile_compat.py", "tests/browser"]
BUSY = "while True: pass"
PROBE = "import time; t = time.perf_counter(); sum(i * i for i in range(3_000_000)); print(time.perf_counter() - t)"


def probe_seconds() -> float:
    """A fixed amount of Python work, timed in a session of its own (as a kernel or a rank would be)."""
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, start_new_session=True)
    return float(out.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factor", type=float, default=3.0, help="how many times slower (default 3)")
    args, pytest_args = parser.parse_known_args(argv)
    cores = os.cpu_count() or 1
    loops = max(0, round((args.factor - 1) * cores))
    quiet = min(probe_seconds() for _ in range(3))
    busy = [subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True) for _ in range(loops)]
    try:
        time.sleep(2)
        slowed = min(probe_seconds() for _ in range(3)) / quiet
        print(f"{loops} busy loops on {cores} cores: a fixed loop takes {slowed:.1f}x as long", flush=True)
        start = time.monotonic()
        command = [sys.executable, "-m", "pytest", "-n", "2", "--durations=15", *(pytest_args or DEFAULT_TESTS)]
        code = subprocess.call(command, cwd=ROOT)
        print(f"{time.monotonic() - start:.0f} s wall, pytest exit {code}, load average {os.getloadavg()[0]:.1f}")
        return code
    finally:
        for process in busy:
            os.kill(process.pid, signal.SIGTERM)
        for process in busy:
            process.wait()


if __name__ == "__main__":
    sys.exit(main())

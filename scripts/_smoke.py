"""What CI's smoke runs share: each step prints what it ran, its output, its result and its seconds, and the run
ends with one summary line a step, so a CI log says at a glance which step failed and how long each took."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time


class Steps:
    """Run steps one after another; :meth:`exit_code` is 0 only if every step passed."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.done: list[tuple[str, int, float, str]] = []  # label, exit status, seconds, last line of output

    def run(self, label: str, argv: list[str], shown: str | None = None, **popen) -> int:
        """Run ``argv`` (``shown`` is what the log prints for it, when the literal argv would hide the command)."""
        print(f"\n== {self.title}: {label}\n$ {shown or shlex.join(argv)}", flush=True)
        start = time.monotonic()
        last = ""
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                last = line.strip() or last
        seconds = time.monotonic() - start
        self.done.append((label, proc.returncode, seconds, last))
        print(
            f"== {label}: {'passed' if proc.returncode == 0 else f'FAILED (exit {proc.returncode})'}, {seconds:.0f} s",
            flush=True,
        )
        return proc.returncode

    def exit_code(self) -> int:
        print(f"\n== {self.title}: summary")
        for label, status, seconds, last in self.done:
            print(f"{'passed' if status == 0 else 'FAILED':6}  {seconds:5.0f} s  {label}: {last[:160]}")
        return 0 if self.done and all(status == 0 for _, status, _, _ in self.done) else 1


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        sys.exit(f"{what} needs root (it runs commands as another account or in a user namespace of its own)")

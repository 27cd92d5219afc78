"""CI smoke run: notebooks 1 and 8 under nbval on a machine that refuses user namespaces.

    .venv/bin/python scripts/smoke_without_namespaces.py [NOTEBOOK ...]

Ubuntu 24.04's AppArmor rule, Docker's default seccomp profile and most hosted notebook containers refuse
unprivileged user namespaces, so the lab's private network cannot be made there. The run plays such a machine:
``unshare -r`` gives it a user namespace of its own, whose ``user.max_user_namespaces`` it sets to 0, which refuses
every namespace below (a nested ``unshare`` fails with ENOSPC; Docker's gives EPERM). It checks that a nested
``unshare -r`` really fails, then runs this interpreter's pytest, with the project's nbval options, on notebook 1
(the quick start) and notebook 8 (whose section 6 needs a real link). Nothing is left: the namespace goes with
its last process.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _smoke import Steps

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ("notebooks/01_quickstart.ipynb", "notebooks/08_when_compression_pays_off.ipynb")
#: Inside the namespace: refuse further namespaces, prove it, then run the command given after it.
REFUSE_THEN_RUN = (
    "echo 0 > /proc/sys/user/max_user_namespaces || exit 3; "
    'if unshare -r true 2>/dev/null; then echo "user namespaces are still allowed here" >&2; exit 3; fi; '
    'exec "$@"'
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", default=list(NOTEBOOKS))
    args = parser.parse_args()
    pytest = [sys.executable, "-m", "pytest", "-n", str(min(2, len(args.notebooks))), *args.notebooks]
    steps = Steps("without user namespaces")
    steps.run(
        "nbval on " + ", ".join(Path(n).name for n in args.notebooks),
        ["unshare", "-r", "sh", "-c", REFUSE_THEN_RUN, "sh", *pytest],
        cwd=ROOT,
    )
    return steps.exit_code()


if __name__ == "__main__":
    sys.exit(main())

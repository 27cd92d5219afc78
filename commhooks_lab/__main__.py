"""``python -m commhooks_lab``: the main job and its subcommands (``commhooks_lab.cli``)."""

import os
import sys

from commhooks_lab.cli import main
from commhooks_lab.launcher.torchrun import under_torchrun

__all__: list[str] = []

if __name__ == "__main__":
    code = main()
    if under_torchrun():
        # The process group is destroyed and every result printed. Leave without running C++
        # static destructors: a gloo thread still joinable there aborts the process now and then
        # ("terminate called without an active exception"), which torchrun reports as a failure.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)
    sys.exit(code)

"""``%ddp start ...`` in the test process's IPython shell, stopped however the block ends: the tests of ``%%ddp``
on plain ranks, behind links and on nodes share it."""

import contextlib
from collections.abc import Iterator

from IPython.core.interactiveshell import InteractiveShell


@contextlib.contextmanager
def ddp_started(options: str) -> Iterator[InteractiveShell]:
    """The shell, with the lab's magics loaded and ``%ddp start {options}`` run; ``%ddp stop`` at the end."""
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "commhooks_lab")
    shell.run_line_magic("ddp", f"start {options}")
    try:
        yield shell
    finally:
        shell.run_line_magic("ddp", "stop")

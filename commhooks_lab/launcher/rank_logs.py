"""Each rank's stderr in a file of its own, so that a rank that dies without a Python exception
(a signal, ``os._exit``, a crash while starting) can still be explained with what it printed.

A spawned rank fails in Python's bootstrap before any of the lab's code runs in it (the classic
unguarded script), so the file must already be its stderr when the process starts: the parent
points its own fd 2 at the file just around ``Process.start()`` (children inherit fd 2) and puts
it back at once. The lines are copied on to the parent's stderr afterwards, where they went before.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator

#: How much of a rank's stderr an error shows.
TAIL_LINES = 20
_TAIL_BYTES = 64 * 1024

_fd2_lock = threading.Lock()


class RankLog:
    """A temporary file that one rank's fd 2 writes to."""

    def __init__(self, rank: int):
        fd, self.path = tempfile.mkstemp(prefix=f"commhooks-rank{rank}-", suffix=".stderr")
        os.close(fd)
        self._forwarded = 0

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` lines the rank wrote (empty if none, or if the file is gone)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - _TAIL_BYTES))
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def forward(self) -> None:
        """Copy what the rank wrote since the last call to this process's own stderr (fd 2)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._forwarded)
                data = f.read()
        except OSError:
            return
        if data:
            self._forwarded += len(data)
            with contextlib.suppress(OSError):
                os.write(2, data)

    def remove(self) -> None:
        self.forward()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


@contextlib.contextmanager
def stderr_into(path: str) -> Iterator[None]:
    """Point this process's fd 2 at ``path`` for the duration (children started now inherit it)."""
    with _fd2_lock:
        if sys.stderr is not None:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
        saved = os.dup(2)
        try:
            target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.dup2(target, 2)
            finally:
                os.close(target)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def redirect_own_stderr(path: str) -> None:
    """In a rank: make ``path`` this process's fd 2 (forkserver children inherit the server's, not ours)."""
    target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(target, 2)
    os.close(target)

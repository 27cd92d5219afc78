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

__all__ = ["RankLog", "redirect_own_stderr", "stderr_into"]

#: How much of a rank's stderr an error shows.
TAIL_LINES = 20
_TAIL_BYTES = 64 * 1024
#: The most of a rank's stderr held in memory at once while it is copied on.
FORWARD_CHUNK = 1 << 20

_fd2_lock = threading.Lock()


class RankLog:
    """A temporary file that one rank's fd 2 writes to, read through a descriptor of our own.

    Once the rank has it open the name is unlinked (``detach``): the file lives exactly as long
    as the rank and this object, and a kernel killed with SIGKILL leaves nothing in /tmp.
    """

    def __init__(self, rank: int | str):
        who = f"rank{rank}" if isinstance(rank, int) else rank
        fd, self.path = tempfile.mkstemp(prefix=f"commhooks-{who}-", suffix=".stderr")
        os.close(fd)
        self._fd: int | None = os.open(self.path, os.O_RDONLY)
        self._linked = True
        self._forwarded = 0

    def _read_from(self, offset: int, most: int | None = None) -> bytes:
        if self._fd is None:
            return b""
        size = os.fstat(self._fd).st_size
        wanted = size - offset if most is None else min(most, size - offset)
        return os.pread(self._fd, wanted, offset) if wanted > 0 else b""

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` lines the rank wrote (empty if none)."""
        if self._fd is None:
            return ""
        data = self._read_from(max(0, os.fstat(self._fd).st_size - _TAIL_BYTES))
        return "\n".join(data.decode("utf-8", errors="replace").rstrip().splitlines()[-lines:])

    def forward(self) -> None:
        """Copy what the rank wrote since the last call to this process's own stderr (fd 2), a chunk at a time:
        a rank that wrote 200 MB raised the kernel's peak memory by 200 MiB when it went in one read."""
        while data := self._read_from(self._forwarded, FORWARD_CHUNK):
            self._forwarded += len(data)
            left = memoryview(data)
            with contextlib.suppress(OSError):
                while left:  # a pipe may take less than a chunk at a time
                    left = left[os.write(2, left) :]

    def detach(self) -> None:
        """Remove the file's name; the rank and this object keep writing and reading it."""
        if self._linked:
            self._linked = False
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def remove(self) -> None:
        """Forward what is left, then let the file go."""
        self.forward()
        self.detach()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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

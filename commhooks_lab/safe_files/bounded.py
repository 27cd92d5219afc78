"""Read an open file up to a limit counted in bytes actually read: ``st_size`` is 0 for a device that never ends."""

from __future__ import annotations

import os
import stat

from .errors import FileTooLarge, UnsafeFileError, kind_of, shown

__all__ = ["read_regular"]

_CHUNK = 1 << 20


def read_regular(fd: int, where: object, limit: int, advice: str) -> bytes:
    """Every byte of the open file ``fd`` if it is a regular file of at most ``limit`` bytes; else a refusal
    naming ``where``. The check is on the descriptor (``fstat``), so a name swapped after it was looked at
    cannot slip a FIFO or a device in."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        raise UnsafeFileError(f"{shown(where)} is {kind_of(mode)}, not a regular file: {advice}")
    chunks, total = [], 0
    while True:
        chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise FileTooLarge(
                f"{shown(where)} holds more than {limit:,} bytes, more than any file the lab writes there: {advice}"
            )

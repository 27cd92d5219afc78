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
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFileError(f"{shown(where)} is {kind_of(info.st_mode)}, not a regular file: {advice}")
    if info.st_size > limit:  # a regular file's size is honest: refused before a byte is read (a sparse 100 GB)
        size = f"{info.st_size:,} bytes"
        raise FileTooLarge(f"{shown(where)} is {size}, more than any file the lab writes there: {advice}")
    chunks: list[bytes] = []
    total = 0
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

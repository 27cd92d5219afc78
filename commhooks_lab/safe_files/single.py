"""A file the learner named by its own path (``lab.load("runs/x.json")``): a link they named is theirs to follow,
but only to a regular file, and never opened if it is a FIFO or a device."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .bounded import read_regular
from .errors import UnsafeFileError, kind_of, shown

__all__ = ["read_file"]

_READ = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_file(path: str | os.PathLike, limit: int, advice: str) -> bytes:
    """The bytes of the regular file at ``path`` (at most ``limit``); FileNotFoundError if there is none."""
    path = Path(path)
    mode = os.stat(path).st_mode  # FileNotFoundError passes through: the caller says what was expected
    if not stat.S_ISREG(mode):
        raise UnsafeFileError(f"{shown(path)} is {kind_of(mode)}, not a regular file: {advice}")
    try:
        fd = os.open(path, _READ)
    except OSError as exc:
        raise UnsafeFileError(f"cannot read {shown(path)} ({exc.strerror}): {advice}") from None
    try:
        return read_regular(fd, path, limit, advice)
    finally:
        os.close(fd)

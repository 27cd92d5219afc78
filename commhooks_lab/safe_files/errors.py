"""A refusal that names the file and says what to do, with a name that cannot forge the message around it."""

from __future__ import annotations

import os
import stat

__all__ = ["FileTooLarge", "UnsafeFileError", "kind_of", "shown"]


class UnsafeFileError(ValueError):
    """A file the lab will not read or write: which one, why, and what to do."""


class FileTooLarge(UnsafeFileError):
    """More bytes than the limit the caller gave: a caller that only compares the file may treat it as different."""


def shown(path: object) -> str:
    """``path`` as text for a message: as is when printable, else quoted with escapes (a newline in a name
    would otherwise start a line of its own in the message)."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    return text if text.isprintable() else repr(text)


_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISREG, "a file"),
)


def kind_of(mode: int) -> str:
    """What a file mode is, in words."""
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")

"""A folder the lab was handed, held open by descriptor: every name in it is opened relative to it, without
following a link, and written by rename so that no reader ever sees half a file."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from .bounded import read_regular
from .errors import UnsafeFileError, kind_of, shown

__all__ = ["Folder", "Staged"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NONBLOCK | _CLOEXEC
_READ = os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
#: A staged file's name: hidden, and short enough that a long final name still leaves room for it.
_STAGED_NAME_CHARS = 100


def _check_name(name: str, where: Path) -> None:
    """One entry of a folder: no separator, no ``..``, no NUL (each would reach outside the folder or fail)."""
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
        raise UnsafeFileError(f"{shown(name)!s} is not a name inside {shown(where)}: give the name of one file there")


@dataclass(frozen=True)
class Staged:
    """A file written whole under a hidden name in ``folder``, waiting for :meth:`Folder.commit`."""

    folder: Folder
    hidden: str
    name: str


class Folder:
    """An open folder; ``advice`` ends every refusal about a file in it (``{path}``: that file's path)."""

    def __init__(self, fd: int, path: Path, advice: str):
        self.fd, self.path, self.advice = fd, path, advice

    @classmethod
    def open(cls, path: str | os.PathLike, advice: str, create: bool = False, mode: int = 0o777) -> Folder:
        """The folder the learner named (a link they named is theirs: followed here, and nowhere inside)."""
        path = Path(path)
        try:
            if create:
                path.mkdir(mode=mode, parents=True, exist_ok=True)
            return cls(os.open(path, _DIRECTORY), path, advice)
        except FileNotFoundError:
            raise
        except OSError as exc:
            not_folder = exc.errno in (errno.ENOTDIR, errno.EEXIST)
            what = "is not a folder" if not_folder else f"cannot be used ({exc.strerror})"
            raise UnsafeFileError(f"{shown(path)} {what}: give a folder you can read and write") from None

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _advice(self, name: str) -> str:
        return self.advice.replace("{path}", shown(self.path / name))

    def refusal(self, name: str, mode: int, wanted: str = "a regular file") -> UnsafeFileError:
        return UnsafeFileError(
            f"{shown(self.path / name)} is {kind_of(mode)}: the lab uses only {wanted} there and follows no link "
            f"inside a folder it is given; {self._advice(name)}"
        )

    def _unusable(self, verb: str, name: str, exc: OSError) -> UnsafeFileError:
        return UnsafeFileError(f"cannot {verb} {shown(self.path / name)} ({exc.strerror}); {self._advice(name)}")

    def mode(self, name: str) -> int | None:
        """The kind of ``name`` itself (a link is a link), or None if there is none."""
        _check_name(name, self.path)
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        return sorted(os.listdir(self.fd))

    def folder(self, name: str, create: bool = False) -> Folder:
        """The folder ``name`` inside this one (made if ``create``); a link or anything else there is refused."""
        mode = self.mode(name)
        if mode is None and create:
            try:
                os.mkdir(name, dir_fd=self.fd)
            except FileExistsError:
                pass
            mode = self.mode(name)
        if mode is None:
            raise FileNotFoundError(errno.ENOENT, "no such folder", str(self.path / name))
        if not stat.S_ISDIR(mode):
            raise self.refusal(name, mode, "folders")
        try:
            fd = os.open(name, _DIRECTORY | _NOFOLLOW, dir_fd=self.fd)
        except OSError as exc:  # swapped for a link since the look above (ELOOP), or not ours to open
            raise self._unusable("open", name, exc) from None
        return Folder(fd, self.path / name, self.advice)

    def read(self, name: str, limit: int) -> bytes:
        """The bytes of the regular file ``name`` (at most ``limit``); FileNotFoundError if there is none."""
        mode = self.mode(name)
        if mode is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(self.path / name))
        if not stat.S_ISREG(mode):
            raise self.refusal(name, mode)  # before opening: a device is never opened
        try:
            fd = os.open(name, _READ, dir_fd=self.fd)
        except OSError as exc:
            raise self._unusable("read", name, exc) from None
        try:
            return read_regular(fd, self.path / name, limit, self._advice(name))
        finally:
            os.close(fd)

    def stage(self, name: str, data: bytes, mode: int = 0o666) -> Staged:
        """``data`` written and synced under a new hidden name; an OSError (a full disk) leaves nothing behind."""
        _check_name(name, self.path)
        hidden = f".{name[:_STAGED_NAME_CHARS]}.{secrets.token_hex(4)}.partial"
        fd = os.open(hidden, _CREATE, mode, dir_fd=self.fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(hidden, dir_fd=self.fd)
            raise
        os.close(fd)
        return Staged(self, hidden, name)

    def write(self, name: str, data: bytes, mode: int = 0o666) -> None:
        """``name`` replaced whole by ``data`` (a link there is replaced, never followed)."""
        self.commit(self.stage(name, data, mode))

    @staticmethod
    def commit(staged: Staged) -> None:
        os.replace(staged.hidden, staged.name, src_dir_fd=staged.folder.fd, dst_dir_fd=staged.folder.fd)

    @staticmethod
    def discard(staged: Staged) -> None:
        try:
            os.unlink(staged.hidden, dir_fd=staged.folder.fd)
        except FileNotFoundError:
            pass

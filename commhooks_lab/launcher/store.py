"""The notebook's rendezvous: a FileStore in a folder only this account can enter.

A TCPStore listens on a port every local account can reach and answers anyone: on a shared workshop server
another user could read and write its keys, and one SET header announcing a 3 GiB value made the store's thread
allocate it (the kernel was OOM-killed), or block every new Cluster by half-opening requests. A ``FileStore``
has no socket at all: ranks meet in a file inside a fresh ``0700`` folder (``tempfile.mkdtemp``), so nothing of the
rendezvous is reachable from another account, for the whole life of a warm Cluster (later process groups,
FSDP2's and subgroups, use the same store). The folder goes when the Cluster stops.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

__all__ = ["PrivateRendezvous"]

PREFIX = "commhooks-rendezvous-"


def _private_parent() -> str | None:
    """``$XDG_RUNTIME_DIR`` (a per-user tmpfs, 0700) when it is ours; else the system temp folder."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        info = os.stat(runtime)
        if info.st_uid == os.getuid() and not info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            return runtime
    return None


class PrivateRendezvous:
    """Where this Cluster's ranks meet: the path of a FileStore in a folder only its owner can enter."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix=PREFIX, dir=_private_parent())  # mode 0700, a name nobody chose
        mode = stat.S_IMODE(os.stat(self.folder).st_mode)
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            self.close()
            raise PermissionError(f"{self.folder} is open to other accounts (mode {mode:o}); refusing to rendezvous")
        self.path = os.path.join(self.folder, "store")

    def close(self) -> None:
        """Remove the folder and the store's file (ranks that still hold it open keep their handle)."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def __repr__(self) -> str:
        return f"PrivateRendezvous({self.path!r})"

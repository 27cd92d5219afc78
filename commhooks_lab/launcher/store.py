"""The notebook's rendezvous: a FileStore in a folder only this account can enter.

A TCPStore listens on a port every local account can reach and answers anyone: on a shared workshop server
another user could read and write its keys, and one SET header announcing a 3 GiB value made the store's thread
allocate it (the kernel was OOM-killed), or block every new Cluster by half-opening requests. A ``FileStore``
has no socket at all: ranks meet in a file inside a fresh ``0700`` folder (``tempfile.mkdtemp``), so nothing of the
rendezvous is reachable from another account, for the whole life of a warm Cluster (later process groups,
FSDP2's and subgroups, use the same store). The folder goes when the Cluster stops.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time

__all__ = ["CHECKED_ABOVE_VARIABLE", "PrivateRendezvous", "no_one_else_can_move"]

PREFIX = "commhooks-rendezvous-"
#: The file in each folder that names the process that made it: its pid and its start time (pids are reused).
OWNER = "owner"
#: A folder without an owner file (made before there was one) goes once it is this old.
UNOWNED_AGE_S = 24 * 3600.0
#: Set for a process in a user namespace of its own (the hook challenge's sandbox child) by its parent outside:
#: a folder whose way up to ``/`` the parent checked. Inside, folders of accounts the namespace does not map (root's
#: ``/tmp`` and ``/`` among them) all read as one overflow owner, so the walk up stops at this folder. Ignored
#: outside a user namespace, where owners can be read.
CHECKED_ABOVE_VARIABLE = "COMMHOOKS_LAB_CHECKED_ABOVE"


def _identity(pid: int) -> str | None:
    """``pid`` and its start time, or None when no such process runs."""
    import psutil

    try:
        return f"{pid} {psutil.Process(pid).create_time():.3f}"
    except psutil.Error:
        return None


def _abandoned(folder: str) -> bool:
    """Did the process that made ``folder`` end without removing it?"""
    try:
        with open(os.path.join(folder, OWNER)) as f:
            owner = f.read().strip()
    except FileNotFoundError:
        owner = ""
    except OSError:
        return False
    if not owner:  # none (made before there was one) or empty (made so by hand): judged by its age
        return time.time() - os.stat(folder).st_mtime > UNOWNED_AGE_S
    pid = owner.split()[0]
    return not pid.isdigit() or _identity(int(pid)) != owner


def remove_abandoned(parent: str) -> list[str]:
    """Remove this account's rendezvous folders in ``parent`` whose owner is gone; returns what went."""
    gone = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            if entry.name.startswith(PREFIX) and entry.is_dir(follow_symlinks=False):
                if entry.stat(follow_symlinks=False).st_uid == os.getuid() and _abandoned(entry.path):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    gone.append(entry.path)
    return gone


def no_one_else_can_move(path: str) -> bool:
    """Can no other account rename or replace a folder on the way to ``path``? Every folder from it up to ``/``
    must belong to this account or root, and one that others may write to must have the sticky bit (as /tmp
    has): in a 0777 folder without it, another account renames this account's folder away and puts its own,
    open to all, in its place. In a user namespace, the walk ends at :data:`CHECKED_ABOVE_VARIABLE`'s folder."""
    checked = os.environ.get(CHECKED_ABOVE_VARIABLE) if _in_user_namespace() else None
    path = os.path.realpath(path)
    while True:
        info = os.stat(path)
        if info.st_uid not in (0, os.getuid()):
            return False
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            return False
        if checked is not None and path == os.path.realpath(checked):
            return True
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def _in_user_namespace() -> bool:
    """Does this process see only part of the machine's user ids (a uid map other than the initial identity)?"""
    try:
        with open("/proc/self/uid_map") as f:
            return f.read().split() != ["0", "0", "4294967295"]
    except OSError:
        return False


def _private_parent() -> str:
    """The first safe place (:func:`no_one_else_can_move`) of: ``$XDG_RUNTIME_DIR`` (a per-user tmpfs, 0700)
    when it is ours, the temp folder (``$TMPDIR``), and a 0700 folder in this account's cache."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        info = os.stat(runtime)
        if info.st_uid == os.getuid() and not info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            if no_one_else_can_move(runtime):
                return runtime
    temp = tempfile.gettempdir()
    if no_one_else_can_move(temp):
        return temp
    cache = os.path.join(os.path.expanduser("~"), ".cache", "commhooks_lab")
    with contextlib.suppress(OSError):
        os.makedirs(cache, mode=0o700, exist_ok=True)
    if os.path.isabs(cache) and os.path.isdir(cache) and no_one_else_can_move(cache):
        return cache
    raise PermissionError(
        f"no private place for the ranks' rendezvous: another account can rename folders in {temp} (no sticky "
        f"bit) and in {cache}; set TMPDIR to a folder only you can write to"
    )


class PrivateRendezvous:
    """Where this Cluster's ranks meet: the path of a FileStore in a folder only its owner can enter."""

    def __init__(self) -> None:
        parent = _private_parent()
        remove_abandoned(parent)
        self.folder = tempfile.mkdtemp(prefix=PREFIX, dir=parent)  # mode 0700, a name nobody chose
        mode = stat.S_IMODE(os.stat(self.folder).st_mode)
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            self.close()
            raise PermissionError(f"{self.folder} is open to other accounts (mode {mode:o}); refusing to rendezvous")
        # written aside, then renamed: another Cluster's sweep never reads a half-written owner (a CI run's read
        # an empty one, between the open and the write)
        owner = os.path.join(self.folder, OWNER)
        with open(owner + ".new", "w") as f:
            f.write(_identity(os.getpid()) or str(os.getpid()))
        os.replace(owner + ".new", owner)
        self.path = os.path.join(self.folder, "store")

    def close(self) -> None:
        """Remove the folder and the store's file (ranks that still hold it open keep their handle)."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def __repr__(self) -> str:
        return f"PrivateRendezvous({self.path!r})"

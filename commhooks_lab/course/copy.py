"""Copy the course into a learner's folder, which may have come off a USB stick or out of a tar.

What is in that folder is not the lab's: a link there is never followed (it is refused, by name, before anything
is written), a FIFO or a device is never opened, and every file is written whole under a hidden name first and
renamed into place only once all of them are (:class:`~commhooks_lab.safe_files.Folder`). So a full disk leaves
the folder as it was, and ``.course.json`` (the hashes of what the lab wrote) is written last.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..safe_files import FileTooLarge, Folder, Staged, UnsafeFileError, parse_json, shown

__all__ = ["CourseCopy", "CourseCopyError", "copy_course"]

MANIFEST = ".course.json"
#: A record of ~25 hashes is a few KiB; more is not one the lab wrote.
MAX_MANIFEST_BYTES = 1 << 20
#: What a refusal about a file in the learner's folder tells them to do.
ADVICE = "remove it (rm {path}) and run the command again: the course's own copy is then written in its place"


class CourseCopyError(ValueError):
    """The course could not be copied: which file, why, and what the folder holds now."""


@dataclass
class CourseCopy:
    """What :func:`copy_course` did: files written, files already identical, edited files it left alone."""

    folder: Path
    written: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)
    repaired: list[Path] = field(default_factory=list)  # a copy cut short (an older lab on a full disk), replaced
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"the course in {self.folder}: {len(self.written)} written, {len(self.unchanged)} already up to date"]
        if self.repaired:
            lines.append(f"{len(self.repaired)} cut-short copies replaced: {', '.join(map(shown, self.repaired))}")
        if self.kept:
            lines.append(
                f"{len(self.kept)} edited by you and kept: {', '.join(map(shown, self.kept))} "
                "(--force replaces them with the course's copies)"
            )
        lines += self.notes
        lines.append(f"start with: jupyter lab {self.folder / 'notebooks' / '01_quickstart.ipynb'}")
        return "\n".join(lines)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _written_before(top: Folder, done: CourseCopy) -> dict[str, str]:
    """The hashes the lab recorded when it last wrote here; a damaged record counts every differing file as edited."""
    mode = top.mode(MANIFEST)
    if mode is None:
        return {}
    if not stat.S_ISREG(mode):
        raise top.refusal(MANIFEST, mode)  # a link, a FIFO, a device: refused by name, never opened
    try:
        recorded = parse_json(top.read(MANIFEST, MAX_MANIFEST_BYTES), top.path / MANIFEST, "the lab's record is lost")
    except UnsafeFileError as exc:  # damaged (cut short, hand-edited, too large): nothing counts as untouched
        done.notes.append(f"note: {exc}; files that differ from the course are kept as your edits")
        return {}
    if not isinstance(recorded, dict):
        done.notes.append(f"note: {shown(top.path / MANIFEST)} is not the lab's record; files that differ are kept")
        return {}
    return {k: v for k, v in recorded.items() if isinstance(k, str) and isinstance(v, str)}


def _cut_short(current: bytes, source: bytes) -> bool:
    """A strict beginning of the course's file: what a copy interrupted by a full disk left (no edit is that)."""
    return len(current) < len(source) and source.startswith(current)


class _Tree:
    """The learner's folder and the folders in it, each opened once (no link followed), closed together."""

    def __init__(self, top: Folder):
        self.top = top
        self.opened: dict[Path, Folder] = {Path("."): top}
        self.made: list[Path] = []

    def folder(self, relative: Path, create: bool) -> Folder | None:
        if relative in self.opened:
            return self.opened[relative]
        parent = self.folder(relative.parent, create)
        if parent is None:
            return None
        missing = parent.mode(relative.name) is None
        if missing and not create:
            return None
        self.opened[relative] = parent.folder(relative.name, create=create)
        if missing:
            self.made.append(relative)
        return self.opened[relative]

    def remove_made(self) -> None:
        """The folders this copy made, removed again (emptiest first) after a failed copy."""
        for relative in reversed(self.made):
            self.opened.pop(relative).close()
            try:
                os.rmdir(relative.name, dir_fd=self.opened[relative.parent].fd)
            except OSError:
                pass

    def close(self) -> None:
        for relative, folder in self.opened.items():
            if relative != Path("."):
                folder.close()


def _plan(
    tree: _Tree, content: Callable[[Path], bytes], names: list[Path], recorded: dict, force: bool, done: CourseCopy
) -> dict:
    """Which files to write (name -> bytes), looking only: every refusal is raised before anything is written."""
    writes, refused = {}, []
    for name in names:
        source = content(name)
        try:
            parent = tree.folder(name.parent, create=False)
            if parent is None or parent.mode(name.name) is None:
                writes[name] = source
                continue
            try:
                current = parent.read(name.name, len(source) + MAX_MANIFEST_BYTES)
            except FileTooLarge:
                current = None
        except UnsafeFileError as exc:
            refused.append(str(exc))
            continue
        if current == source:
            done.unchanged.append(name)
        elif current is not None and _cut_short(current, source):
            done.repaired.append(name)
            writes[name] = source
        elif force or (current is not None and recorded.get(str(name)) == _sha256(current)):
            writes[name] = source
        else:
            done.kept.append(name)
    if refused:
        raise CourseCopyError("nothing was copied:\n" + "\n".join(f"- {line}" for line in refused))
    return writes


def _write(tree: _Tree, writes: dict[Path, bytes], done: CourseCopy) -> None:
    """Every file staged whole, then all renamed into place; a failure while staging changes nothing."""
    staged: list[Staged] = []
    try:
        for name, data in writes.items():
            parent = tree.folder(name.parent, create=True)
            assert parent is not None
            staged.append(parent.stage(name.name, data))
    except OSError as exc:
        for item in staged:
            Folder.discard(item)
        tree.remove_made()
        cause = "the disk is full" if exc.errno == 28 else exc.strerror or str(exc)
        raise CourseCopyError(
            f"could not write the course into {shown(tree.top.path)} ({cause}, writing {shown(name)}): nothing there "
            "was changed. Free some space, or give a folder you can write to, and run the command again"
        ) from None
    for item in staged:
        Folder.commit(item)
    done.written.extend(writes)


def copy_course(folder: str | Path, force: bool = False, lang: str | None = None) -> CourseCopy:
    """Copy the course into ``folder``; a file there that the learner changed is kept unless ``force``. ``lang``
    ("ko"): the notebooks and glossary with their translated paragraphs (code and outputs as in English)."""
    from . import course_root

    if not str(folder).strip():
        raise CourseCopyError(
            "the folder for the course is empty text (an unset variable?): give a folder, e.g. "
            "`python -m commhooks_lab notebooks ~/commhooks-course`, or `.` for this one"
        )
    folder = Path(folder).expanduser()
    root = course_root()
    content = _content(root, lang)
    done = CourseCopy(folder)
    new = not os.path.lexists(folder)
    try:
        return _copy(folder, root, content, force, done)
    except CourseCopyError:
        if new:  # a folder this copy made is removed again if it failed (left only if something is in it)
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise


def _content(root: Path, lang: str | None) -> Callable[[Path], bytes]:
    """A course file's bytes as the copy writes them: the English, or in ``lang`` (refused if the course has none)."""
    if lang is None or lang == "en":
        return lambda name: (root / name).read_bytes()
    from .translation import languages, translate_file

    if lang not in languages(root):
        have = ", ".join(repr(code) for code in ["en", *languages(root)])
        raise CourseCopyError(f"the course has no translation {lang!r}: choose one of {have}")
    return functools.cache(lambda name: translate_file(root, lang, name, (root / name).read_bytes()))


def _copy(folder: Path, root: Path, content: Callable[[Path], bytes], force: bool, done: CourseCopy) -> CourseCopy:
    from . import course_files

    with Folder.open(folder, ADVICE, create=True) as top:
        tree = _Tree(top)
        try:
            recorded = _written_before(top, done)
            names = course_files(root)
            _write(tree, _plan(tree, content, names, recorded, force, done), done)
            unchanged = {str(n): _sha256(content(n)) for n in done.written + done.unchanged}
            if done.written:
                try:
                    top.write(MANIFEST, json.dumps({**recorded, **unchanged}, indent=1, sort_keys=True).encode())
                except OSError as exc:
                    raise CourseCopyError(
                        f"the {len(done.written)} course files are written, whole, but {shown(folder / MANIFEST)} "
                        f"could not be ({exc.strerror}): the next copy will keep them as edited unless --force"
                    ) from None
        finally:
            tree.close()
    return done

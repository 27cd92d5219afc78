"""The course that ships with the package: the notebooks, their glossary, the reference pages and teaching notes.

A wheel carries them as package data under ``commhooks_lab/course`` (``setup.py`` copies them in at
build time); an editable install reads them from the source tree. Either way the copy keeps the
repository's layout (``notebooks/`` beside ``docs/``), so every link between them still resolves.
A learner's edited copy is never overwritten unless they say so; a copy they never touched (its
hash is the one :func:`copy_course` wrote, kept in ``.course.json``) is brought up to date.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

__all__ = ["COURSE_FILES", "CourseCopy", "copy_course", "course_files", "course_root"]

#: What the course is, relative to its root (the repository's root, or the package's ``course`` folder).
COURSE_FILES = (
    "notebooks/*.ipynb",
    "notebooks/GLOSSARY.md",
    "docs/teaching.md",
    "docs/reference/*.md",
    "docs/images/*.png",
)


def course_root() -> Path:
    """Where this installation keeps the course: the wheel's package data, else the source tree."""
    packaged = Path(str(resources.files(__name__)))
    if (packaged / "notebooks").is_dir():
        return packaged
    source = Path(__file__).resolve().parents[2]
    if (source / "notebooks").is_dir() and (source / "pyproject.toml").is_file():
        return source
    raise FileNotFoundError(
        f"this installation of commhooks_lab has no course: neither {packaged} nor a source tree's notebooks/ "
        "(reinstall from a wheel or a clone)"
    )


def course_files(root: Path | None = None) -> list[Path]:
    """Every file of the course, relative to ``root``, in a stable order."""
    root = course_root() if root is None else root
    found = {p.relative_to(root) for pattern in COURSE_FILES for p in root.glob(pattern) if p.is_file()}
    return sorted(found)


@dataclass
class CourseCopy:
    """What :func:`copy_course` did: files written, files already identical, edited files it left alone."""

    folder: Path
    written: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"the course in {self.folder}: {len(self.written)} written, {len(self.unchanged)} already up to date"]
        if self.kept:
            lines.append(
                f"{len(self.kept)} edited by you and kept: {', '.join(map(str, self.kept))} "
                "(--force replaces them with the course's copies)"
            )
        lines.append(f"start with: jupyter lab {self.folder / 'notebooks' / '01_quickstart.ipynb'}")
        return "\n".join(lines)


MANIFEST = ".course.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _written_before(folder: Path) -> dict[str, str]:
    try:
        recorded = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def copy_course(folder: str | Path, force: bool = False) -> CourseCopy:
    """Copy the course into ``folder``; a file there that the learner changed is kept unless ``force``."""
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file: give a folder for the course")
    root = course_root()
    done = CourseCopy(folder)
    recorded = _written_before(folder)
    for name in course_files(root):
        source, target = root / name, folder / name
        if target.exists() and filecmp.cmp(source, target, shallow=False):
            done.unchanged.append(name)
            continue
        untouched = target.exists() and recorded.get(str(name)) == _sha256(target)
        if target.exists() and not (force or untouched):
            done.kept.append(name)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        recorded[str(name)] = _sha256(target)
        done.written.append(name)
    if done.written:
        (folder / MANIFEST).write_text(json.dumps(recorded, indent=1, sort_keys=True))
    return done

"""The course that ships with the package: the notebooks, their glossary, the reference pages and teaching notes.

A wheel carries them as package data under ``commhooks_lab/course`` (``setup.py`` copies them in at
build time); an editable install reads them from the source tree. Either way the copy keeps the
repository's layout (``notebooks/`` beside ``docs/``), so every link between them still resolves.
A learner's edited copy is never overwritten unless they say so; a copy they never touched (its
hash is the one :func:`copy_course` wrote, kept in ``.course.json``) is brought up to date.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["CATALOGUES", "COURSE_FILES", "CourseCopy", "copy_course", "course_files", "course_root"]

#: What the course is, relative to its root (the repository's root, or the package's ``course`` folder).
COURSE_FILES = (
    "notebooks/*.ipynb",
    "notebooks/GLOSSARY.md",
    "docs/teaching.md",
    "docs/reference/*.md",
    "docs/images/*.png",
)
#: Shipped beside the course but not copied out: its translations (``copy_course(lang=...)`` reads them).
CATALOGUES = ("locale/*/LC_MESSAGES/notebooks/*.po",)


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


from .copy import CourseCopy, copy_course  # noqa: E402  (copy reads course_root from here)

"""The one build step pyproject.toml cannot say: the wheel carries the course as package data.

The notebooks live at the top of the repository (``notebooks/``, ``docs/teaching.md``), where a
clone's learner opens them; a wheel has no such place, so ``build_py`` copies them into
``commhooks_lab/course`` (``commhooks_lab.course`` finds them there). An editable install reads the
source tree instead, so nothing is copied then.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# commhooks_lab.course.COURSE_FILES
COURSE = ("notebooks/*.ipynb", "notebooks/GLOSSARY.md", "docs/teaching.md", "docs/reference/*.md", "docs/images/*.png")
# commhooks_lab.course.CATALOGUES: the translations, read by `notebooks --lang`
CATALOGUES = ("locale/*/LC_MESSAGES/notebooks/*.po",)


class BuildPyWithCourse(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "commhooks_lab" / "course"
        for pattern in COURSE + CATALOGUES:
            for source in sorted(ROOT.glob(pattern)):
                copy = target / source.relative_to(ROOT)
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, copy)


setup(cmdclass={"build_py": BuildPyWithCourse})

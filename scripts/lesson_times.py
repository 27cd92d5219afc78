"""How long each lesson takes a learner at the least: its reading, its run time, and its exercises.

    python scripts/lesson_times.py [--wpm 238]

Reading is the markdown's words (the rules of ``long_sentences.py``: code, formulas and tables left out) at 238
words a minute, the mean silent reading rate for non-fiction in M. Brysbaert's meta-analysis of 190 studies
("How many words do we read per minute?", Journal of Memory and Language 109, 2019). A chapter with formulas,
tables and code to follow reads slower, so the figure is a floor, not a forecast. Run time is the notebook's own
(``docs/teaching.md``'s "Run times" table, measured with ``execute_notebooks.py``). Exercises are counted, not
timed: the plan in ``docs/teaching.md`` allows them time on top (``EXERCISE_MINUTES``), and
``tests/unit/test_teaching_plan.py`` holds every slot of that plan to at least this floor.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from long_sentences import markdown_of, sentences, words

ROOT = Path(__file__).resolve().parents[1]
TEACHING = ROOT / "docs" / "teaching.md"
WORDS_PER_MINUTE = 238
#: What the plan allows for each exercise on top of the floor: an allowance, not a measurement.
EXERCISE_MINUTES = 5
_EXERCISE = re.compile(r"^## Exercise", re.M)
_RUN_ROW = re.compile(r"^\| (\d\d|problems people report) [^|]*\| (\d+)(?:–\d+)? s", re.M)
#: The course's chapters outside the numbered sequence, with the name the plans and the run-time table give them.
CHAPTERS = {"problems_people_report": "problems people report"}


def run_seconds() -> dict[str, int]:
    """Each notebook's run time with portable numerics, from the "Run times" table: ``{"01": 9, ...}``, and the
    chapters outside the sequence under their names (:data:`CHAPTERS`)."""
    return {number: int(seconds) for number, seconds in _RUN_ROW.findall(TEACHING.read_text(encoding="utf-8"))}


def lesson(path: Path, wpm: int = WORDS_PER_MINUTE) -> dict:
    """One notebook's words, exercises, run time and floor in minutes (reading plus running, rounded up)."""
    text = markdown_of(path)
    count = sum(words(s) for s in sentences(text))
    seconds = run_seconds().get(CHAPTERS.get(path.stem, path.name[:2]), 0)
    return {
        "notebook": path.stem,
        "words": count,
        "exercises": len(_EXERCISE.findall(text)),
        "run_s": seconds,
        "floor_min": math.ceil(count / wpm + seconds / 60),
    }


def lessons(wpm: int = WORDS_PER_MINUTE) -> list[dict]:
    paths = [*sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")), *(ROOT / "notebooks" / f"{c}.ipynb" for c in CHAPTERS)]
    return [lesson(path, wpm) for path in paths]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wpm", type=int, default=WORDS_PER_MINUTE)
    args = parser.parse_args(argv)
    allowance = f"with {EXERCISE_MINUTES} min each"
    print(f"| notebook | words read | run time | floor (reading + run) | exercises | {allowance} |")
    print("|---|---|---|---|---|---|")
    for row in lessons(args.wpm):
        total = row["floor_min"] + EXERCISE_MINUTES * row["exercises"]
        print(
            f"| {row['notebook']} | {row['words']:,} | {row['run_s']} s | {row['floor_min']} min "
            f"| {row['exercises']} | {total} min |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

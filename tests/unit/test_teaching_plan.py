"""docs/teaching.md's plans give each notebook at least its floor: reading at 238 words a minute, its run time,
and the allowance for each exercise (``scripts/lesson_times.py``). The plan's minutes were guessed once, and a
review found them unrealistic; now a lesson that grows makes this fail until its slot grows too."""

import re

from conftest import load_script

lesson_times = load_script("lesson_times")

#: A plan row: ``| 10–30 | 02 | ...`` or ``| 0–25 | set-up check, 01 | ...``.
ROW = re.compile(r"^\| (\d+)–(\d+) \| ([^|]*) \|", re.M)


def key(stem: str) -> str:
    """How the plans name a notebook: its two digits, or a chapter's stem."""
    return stem if stem in lesson_times.CHAPTERS else stem[:2]


def slots() -> list[tuple[int, list[str]]]:
    """Each plan row's minutes and the notebooks it names: two-digit numbers, or a chapter's name."""
    text = lesson_times.TEACHING.read_text(encoding="utf-8")
    found = []
    for start, end, what in ROW.findall(text):
        names = re.findall(r"\b\d\d\b", what) + [c for c, name in lesson_times.CHAPTERS.items() if name in what]
        found.append((int(end) - int(start), names))
    return found


def test_every_slot_of_the_plans_holds_its_notebooks_floor_and_exercises():
    need = {
        key(row["notebook"]): row["floor_min"] + lesson_times.EXERCISE_MINUTES * row["exercises"]
        for row in lesson_times.lessons()
    }
    found = slots()
    assert len(found) >= 10, "the plans' rows were not found: did their format change?"
    short = [(minutes, numbers) for minutes, numbers in found if numbers and minutes < sum(need[n] for n in numbers)]
    assert not short, f"slots shorter than their notebooks' floor ({need}): {short}"


def test_the_floor_counts_reading_and_running():
    for row in lesson_times.lessons():
        assert row["words"] > 1000 and row["run_s"] > 0, row  # every lesson and chapter has its run time
        assert row["floor_min"] * lesson_times.WORDS_PER_MINUTE >= row["words"]


def test_every_lesson_and_chapter_has_a_slot():
    named = {name for _, names in slots() for name in names}
    rows = lesson_times.lessons()
    assert {key(r["notebook"]) for r in rows} <= named

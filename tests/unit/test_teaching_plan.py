"""docs/teaching.md's plans give each notebook at least its floor: reading at 238 words a minute, its run time,
and the allowance for each exercise (``scripts/lesson_times.py``). The plan's minutes were guessed once, and a
review found them unrealistic; now a lesson that grows makes this fail until its slot grows too."""

import re

from conftest import load_script

lesson_times = load_script("lesson_times")

#: A plan row: ``| 10–30 | 02 | ...`` or ``| 0–25 | set-up check, 01 | ...``.
ROW = re.compile(r"^\| (\d+)–(\d+) \| ([^|]*) \|", re.M)


def slots() -> list[tuple[int, list[str]]]:
    text = lesson_times.TEACHING.read_text(encoding="utf-8")
    return [(int(end) - int(start), re.findall(r"\b\d\d\b", what)) for start, end, what in ROW.findall(text)]


def test_every_slot_of_the_plans_holds_its_notebooks_floor_and_exercises():
    need = {
        row["notebook"][:2]: row["floor_min"] + lesson_times.EXERCISE_MINUTES * row["exercises"]
        for row in lesson_times.lessons()
    }
    found = slots()
    assert len(found) >= 10, "the plans' rows were not found: did their format change?"
    short = [(minutes, numbers) for minutes, numbers in found if numbers and minutes < sum(need[n] for n in numbers)]
    assert not short, f"slots shorter than their notebooks' floor ({need}): {short}"


def test_the_floor_counts_reading_and_running():
    row = lesson_times.lessons()[0]
    assert row["words"] > 1000 and row["run_s"] > 0
    assert row["floor_min"] * lesson_times.WORDS_PER_MINUTE >= row["words"]

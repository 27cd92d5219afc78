"""The suite's own layout: each test file in its kind's folder, each kind a registered marker, one test file per
exercise module named after it, and no two tests or test files with the same name."""

import ast
from collections import defaultdict
from pathlib import Path

import tomllib
from conftest import FOLDERS, KINDS, kind_of

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
EXERCISES = ROOT / "commhooks_lab" / "exercises"


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def test_every_test_file_sits_in_the_folder_of_its_kind():
    outside = [str(p.relative_to(ROOT)) for p in _test_files() if kind_of(p.relative_to(ROOT)) is None]
    assert not outside, (
        f"{outside}: put each test file in the folder of its kind, {', '.join(FOLDERS.values())} "
        "(docs/reference/architecture.md, 'The test suite'); the folder gives it its marker"
    )


def test_every_kind_is_a_registered_marker_and_marks_its_items(pytestconfig):
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = [line.split(":")[0] for line in options["markers"]]
    assert registered == [*KINDS, "heavy", "waits"]  # one marker per folder, and the order rule's two
    assert "--strict-markers" in options["addopts"].split()
    assert kind_of(Path("notebooks/01_quickstart.ipynb")) == "notebooks"
    assert kind_of(Path("tests/test_new.py")) is None and kind_of(Path("tests/elsewhere/test_new.py")) is None


def test_each_exercise_module_has_one_test_file_named_after_it():
    """``commhooks_lab/exercises/<module>.py`` is tested in ``tests/<kind>/test_exercises_<module>.py``."""
    # checking.py holds the pieces every checker shares (say, choice_problem, ...): each exercise's tests test it
    modules = {p.stem for p in EXERCISES.glob("*.py") if p.stem not in ("__init__", "checking")}
    files = defaultdict(list)
    for path in _test_files():
        if path.stem.startswith("test_exercises_"):
            files[path.stem.removeprefix("test_exercises_")].append(str(path.relative_to(ROOT)))
    missing = sorted(modules - files.keys())
    assert not missing, f"exercise modules without tests/<kind>/test_exercises_<module>.py: {missing}"
    orphans = sorted(set(files) - modules)
    assert not orphans, f"test_exercises_<module>.py names no module of commhooks_lab/exercises: {orphans}"
    assert all(len(paths) == 1 for paths in files.values()), dict(files)


def test_no_two_test_files_and_no_two_tests_share_a_name():
    """Files: pytest imports each by its bare name (its folder on sys.path), so two of one name collide. Tests: a
    name found twice reads as one test in a report; name each for what it checks."""
    by_file_name = defaultdict(list)
    by_test_name = defaultdict(list)
    for path in _test_files():
        by_file_name[path.name].append(str(path.relative_to(ROOT)))
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
                by_test_name[node.name].append(str(path.relative_to(ROOT)))
    assert not {n: p for n, p in by_file_name.items() if len(p) > 1}
    assert not {n: p for n, p in by_test_name.items() if len(p) > 1}

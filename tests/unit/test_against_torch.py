"""scripts/against_torch.py's table: what changed with another torch is named (which hook, which number), the rest
counted; failed tests and notebook cells are named, from pytest's junit report."""

import xml.etree.ElementTree as ET

from conftest import load_script

REPORT = """<testsuites><testsuite>
<testcase classname="notebooks.03_fp16_vs_bf16.ipynb" name="Cell 13"/>
<testcase classname="notebooks.03_fp16_vs_bf16.ipynb" name="Cell 14"><failure message="x"/></testcase>
<testcase classname="notebooks.13_from_lab_to_production.ipynb" name="Cell 9"/>
<testcase classname="tests.test_engine" name="test_a"><error message="y"/></testcase>
<testcase classname="tests.test_engine" name="test_b"><skipped/></testcase>
</testsuite></testsuites>"""


def test_changed_behaviours_are_named_with_both_values_and_the_rest_counted():
    script = load_script("against_torch")
    before = {"torch": "2.13.0+cpu", "DDP bf16": "refused", "fingerprint mlp": "59", "main job bf16 notes": "1"}
    after = {**before, "torch": "2.14.1+cu130", "DDP bf16": "accepted", "main job bf16 notes": "0"}
    lines = script.behaviours_part(before, after)
    text = "\n".join(lines)
    assert "torch 2.13.0+cpu (this venv) -> torch 2.14.1+cu130" in lines[0]
    assert "main job bf16 notes  1" in text and "-> 0" in text and "-> accepted" in text
    assert "fingerprint mlp" not in text.split("unchanged")[0], "an unchanged digest is counted, not listed"
    assert lines[-1].endswith("fingerprint 1 of 1, main job 0 of 1 (2 of 3 behaviours changed)"), lines[-1]


def test_failed_tests_and_notebook_cells_are_named_from_the_junit_report(monkeypatch):
    script = load_script("against_torch")
    monkeypatch.setattr(script, "pytest_in", lambda *args: (ET.fromstring(REPORT), 12.0))
    tests = script.tests_part("python", 1)
    assert tests[0].startswith("tests: 2 passed, 2 failed, 1 skipped")
    assert "  FAILED tests.test_engine::test_a" in tests
    notebooks = script.notebooks_part("python", 1)
    (nb03,) = [line for line in notebooks if "03_fp16_vs_bf16" in line]
    assert "FAILS" in nb03 and "1 cells passed, 1 failed (cells 14)" in nb03
    (nb13,) = [line for line in notebooks if "13_from_lab" in line]
    assert "passes" in nb13 and "1 cells passed, 0 failed" in nb13

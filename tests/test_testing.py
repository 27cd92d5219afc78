"""What a course author gets: nbval for their own notebooks from the installed package, golden Results for hooks."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import commhooks_lab as lab
from commhooks_lab import testing

TEMPLATE = Path(__file__).resolve().parents[1] / "notebooks" / "template_your_lab.ipynb"
pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def nbval(notebook: Path) -> subprocess.CompletedProcess:
    """Strict nbval on ``notebook`` with only what the installed package ships (no repo config)."""
    args = [sys.executable, "-m", "pytest", str(notebook), "-q", "-p", "no:cacheprovider", "-c", "/dev/null"]
    return subprocess.run(
        args + ["--rootdir", str(notebook.parent), *testing.nbval_args()],
        capture_output=True,
        text=True,
        cwd=notebook.parent,
        timeout=300,
    )


def test_the_sanitize_file_ships_with_the_package():
    text = testing.sanitize_file().read_text()
    assert "0xADDRESS" in text and "pid=PID" in text
    assert testing.nbval_args()[-1] == str(testing.sanitize_file())


def test_the_template_passes_strict_nbval_twice_outside_the_repo(tmp_path):
    copy = tmp_path / "my_lab.ipynb"
    shutil.copy(TEMPLATE, copy)
    for _ in range(2):
        out = nbval(copy)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
        assert "3 passed" in out.stdout or "passed" in out.stdout
    # and it has teeth: a changed committed output fails
    nb = json.loads(copy.read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code" and c["outputs"])
    cell["outputs"][0]["text"] = ["worst rel_error 9.9e-01; bytes per step 1\n", "ranks agree: True\n"]
    copy.write_text(json.dumps(nb))
    assert nbval(copy).returncode != 0


@pytest.fixture(scope="module")
def fp16_result():
    return lab.run(hook="fp16", steps=3)


def test_a_result_matches_its_own_golden_file(tmp_path, fp16_result):
    golden = tmp_path / "fp16.json"
    testing.assert_matches_golden(fp16_result, golden)  # first call writes it
    assert golden.exists()
    testing.assert_matches_golden(fp16_result, golden)
    assert testing.compare_with_golden(fp16_result, lab.load(golden)) == []


def test_moved_bytes_and_errors_are_named(tmp_path, fp16_result):
    golden = tmp_path / "fp16.json"
    fp16_result.save(golden)
    changed = lab.load(golden)
    changed.steps.loc[1, "payload_bytes"] += 2
    changed.steps.loc[2, "rel_error"] *= 1.0005  # within rel_error's 1e-3
    moved = testing.compare_with_golden(changed, lab.load(golden))
    assert [(m.column, m.step) for m in moved] == [("payload_bytes", 1)]
    changed.steps.loc[0, "rel_error"] *= 1.01
    with pytest.raises(AssertionError) as failure:
        testing.assert_matches_golden(changed, golden)
    assert "payload_bytes at step 1" in str(failure.value) and "rel_error at step 0" in str(failure.value)

"""What a course author gets: nbval for their own notebooks from the installed package, golden Results for hooks."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import commhooks_lab as lab
from commhooks_lab import testing

TEMPLATE = Path(__file__).resolve().parents[2] / "notebooks" / "template_your_lab.ipynb"
pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def nbval(
    notebooks: list[Path], *options: str, tolerant: bool = False, prewarm: bool = True
) -> subprocess.CompletedProcess:
    """nbval (strict, or ``tolerant``) on ``notebooks``, all in one folder, with only what the installed package
    ships (no repo config). ``prewarm=False``: kernels that import the lab for a note or two start no rank server
    and import no run's modules (``COMMHOOKS_LAB_PREWARM=0``), seconds of CPU each that such a notebook never uses."""
    folder = notebooks[0].parent
    args = [sys.executable, "-m", "pytest", *map(str, notebooks), "-q", "-p", "no:cacheprovider", "-c", "/dev/null"]
    env = {**os.environ, **({} if prewarm else {"COMMHOOKS_LAB_PREWARM": "0"})}
    return subprocess.run(
        args + [*options, "--rootdir", str(folder), *testing.nbval_args(tolerant)],
        capture_output=True,
        text=True,
        cwd=folder,
        env=env,
        timeout=300,
    )


def write_notebook(path: Path, cells: list[tuple[str, list[dict], dict]]) -> Path:
    """A notebook of code cells ``(source, committed outputs, metadata)``, numbered as a clean run numbers them."""
    nb = nbformat.v4.new_notebook()
    for number, (source, outputs, metadata) in enumerate(cells, 1):
        cell = nbformat.v4.new_code_cell(source, metadata=metadata, execution_count=number)
        cell.outputs = outputs
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.write_text(json.dumps(nb))
    return path


def stream(text: str) -> dict:
    return nbformat.v4.new_output("stream", name="stdout", text=text)


def failed_notebooks(stdout: str) -> set[str]:
    return {line.split("::")[0].split()[-1] for line in stdout.splitlines() if line.startswith("FAILED")}


def test_the_sanitize_file_ships_with_the_package():
    text = testing.sanitize_file().read_text()
    assert "0xADDRESS" in text and "pid=PID" in text
    assert testing.nbval_args()[-1] == str(testing.sanitize_file())


def test_the_template_passes_strict_nbval_outside_the_repo_and_a_changed_output_fails_it(tmp_path):
    """A copy of the template, alone in a folder of its own, with only what the installed package ships, passes;
    beside it, its first checked output moved within the tolerant test's tolerance (below) fails, as strict mode
    must (a one-cell notebook that prints that output: the fault is strict mode's, not the run's). (It ran twice
    here until CI's 20 minutes ran short; the notebooks' own nbval run repeats every committed output.) One pytest
    process runs both: a pytest start costs seconds."""
    copy = tmp_path / "my_lab.ipynb"
    shutil.copy(TEMPLATE, copy)
    out = nbval([copy, _moved_within(tmp_path)], "-rfp")
    failed = failed_notebooks(out.stdout)
    assert failed == {"within.ipynb"}, out.stdout[-3000:] + out.stderr[-2000:]
    passed = [line for line in out.stdout.splitlines() if line.startswith("PASSED my_lab.ipynb::")]
    assert len(passed) == 3 and "Cell outputs differ" in out.stdout, out.stdout[-3000:]  # the template: 3 cells


#: ``lab.run(hook="fp16", steps=3).steps`` as it printed: every column and dtype of a run's steps (integer bytes,
#: a boolean, floats, a column of NaN that golden files do not compare), which is all a golden file holds.
FP16_STEPS = {
    "step": [0, 1, 2], "loss": [2.290396, 2.319062, 2.283656], "accuracy": [float("nan")] * 3,
    "payload_bytes": [19220] * 3, "ring_bytes": [19220.0] * 3, "wire_bytes": [19796] * 3, "allgather_bytes": [0] * 3,
    "allgather_calls": [0] * 3, "collective_calls": [1] * 3, "uncompressed_bytes": [38440] * 3, "buckets": [1] * 3,
    "compressing": [True] * 3, "step_time_s": [0.035405, 0.035210, 0.004276],
    "rel_error": [0.000304, 0.000312, 0.000293], "cosine": [1.0] * 3, "max_abs_error": [0.000021, 0.000043, 0.000028],
    "rank_spread": [0.0] * 3, "cumulative_rel_error": [0.000304, 0.000246, 0.000212],
}  # fmt: skip


@pytest.fixture
def fp16_result():
    """A Result with a real fp16 run's steps. The golden functions read nothing else, and a run (two ranks
    started, seconds of CPU) would only add what the lab's own run tests check."""
    import pandas as pd

    return lab.Result({"hook": "fp16", "steps": 3}, pd.DataFrame(FP16_STEPS), pd.DataFrame())


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


# -- tolerant notebook checks ------------------------------------------------------------------------------

TOL = testing.Tolerance(rtol=1e-3, atol=1e-9)


def test_numbers_move_within_the_tolerance_and_the_rest_must_stay():
    from commhooks_lab.testing.notebooks import compare_text

    ok, moved = compare_text("fp16 rel_error 2.9738e-04, loss 1.995", "fp16 rel_error 2.9744e-04, loss 1.995", TOL)
    assert ok == "" and [(m.ref, m.new) for m in moved] == [("2.9738e-04", "2.9744e-04")]
    beyond, _ = compare_text("rel_error 0.073", "rel_error 0.150", TOL)
    assert "beyond the tolerance (rtol=0.001" in beyond and "0.073 became 0.150" in beyond
    integer, _ = compare_text("11800 bytes per step", "11801 bytes per step", TOL)
    assert "integer 11800 became 11801 (integers must match exactly)" in integer
    loose, _ = compare_text("11800 bytes per step", "11801 bytes per step", testing.Tolerance(rtol=10.0))
    assert "integers must match exactly" in loose, "no tolerance excuses an integer"
    text, _ = compare_text("ranks agree: True", "ranks agree: False", TOL)
    assert "the text differs, not just numbers" in text
    names, _ = compare_text("power_sgd r1 fp16", "power_sgd r2 fp16", testing.Tolerance(rtol=10.0))
    assert names.startswith("the text differs"), "r1 and fp16 are names, not numbers"
    padded, _ = compare_text("x   0.0487\ny  1.23", "x  0.049\ny  1.23", testing.Tolerance(rtol=0.01))
    assert padded == "", "a table's padding follows the width of its numbers"
    strict, moved = compare_text("2.9738e-04", "2.9744e-04", testing.notebooks.STRICT)
    assert strict.startswith("the output differs (strict)") and len(moved) == 1


def test_a_text_difference_is_shown_where_it_is_not_the_same_text_twice():
    """The report quotes both sides from just before their first difference: a line that differs after 80 equal
    characters, or one that only gains text at its end, never reads "'x' became 'x'"."""
    from commhooks_lab.testing.notebooks import compare_text

    same_start = "- hook bf16: DDP refuses it by name on this build; the lab measures the same arithmetic "
    problem, _ = compare_text(same_start + "inside its probe", same_start + "as registered", TOL)
    ref_side, new_side = problem.removeprefix("the text differs, not just numbers: ").split(" became ")
    assert ref_side != new_side and "inside its probe" in ref_side and "as registered" in new_side, problem
    longer, _ = compare_text("loss 1.995", "loss 1.995 (3 notes)", TOL)
    assert "'loss <n>' became 'loss <n> (<n> notes)'" in longer, longer


def test_a_cell_states_its_own_tolerance_over_the_notebooks():
    notebook = {"commhooks_lab": {"tolerance": {"rtol": 1e-6}}}
    cell = {"commhooks_lab": {"tolerance": {"rtol": 0.02, "atol": 1e-8, "why": "measured"}}}
    assert testing.tolerance_of(notebook, cell) == testing.Tolerance(0.02, 1e-8, "measured")
    assert testing.tolerance_of(notebook, {}) == testing.Tolerance(1e-6)
    assert testing.tolerance_of({}, {}) == testing.notebooks.STRICT
    with pytest.raises(ValueError, match="rtol must be a finite number >= 0"):
        testing.tolerance_of({"commhooks_lab": {"tolerance": {"rtol": -1}}})
    with pytest.raises(ValueError, match="unknown tolerance fields"):
        testing.tolerance_of({"commhooks_lab": {"tolerance": {"rtool": 1}}})


def test_the_cells_left_uncompared_are_those_strict_nbval_leaves():
    """The tolerant comparison and the course's own tests skip exactly the cells nbval skips: tagged (the course's
    way, since a reader sees no tag) or marked by a comment line, which nbval lets win over a tag; a marker's name
    in a string or in prose is no marker."""
    from commhooks_lab.testing.notebooks import not_compared

    def cell(source: str, *tags: str) -> dict:
        return {"cell_type": "code", "source": source, "metadata": {"tags": list(tags)} if tags else {}}

    assert not_compared(cell("x = 1", "nbval-ignore-output"))
    assert not_compared(cell("x = 1", "nbval-skip"))
    assert not_compared(cell("#  NBVAL_IGNORE_OUTPUT\nx = 1"))
    assert not not_compared(cell("x = 1"))
    assert not not_compared(cell("x = 1", "hide-input"))
    assert not not_compared(cell("# NBVAL_CHECK_OUTPUT\nx = 1", "nbval-ignore-output")), "nbval: the comment wins"
    assert not not_compared(cell('print("NBVAL_IGNORE_OUTPUT")\n# see NBVAL_IGNORE_OUTPUT above'))


def _first_output_text() -> list[str]:
    nb = json.loads(TEMPLATE.read_text())
    return next(c for c in nb["cells"] if c["cell_type"] == "code" and c["outputs"])["outputs"][0]["text"]


def _nudged(lines: list[str], factor: float) -> list[str]:
    """The committed lines with every decimal number scaled by ``factor`` (printed with the same digits)."""
    from commhooks_lab.testing.notebooks import NUMBER, is_integer

    def scale(match) -> str:
        token = match.group(0)
        if is_integer(token):
            return token
        digits = len(token.split("e")[0].split(".")[-1])
        return f"{float(token) * factor:.{digits}e}" if "e" in token else f"{float(token) * factor:.{digits}f}"

    return [NUMBER.sub(scale, line) for line in lines]


def _printing(tmp_path: Path, name: str, committed: list[str], tolerance: dict) -> Path:
    """A one-cell notebook that prints the template's first checked output (what its ``lab.run`` cell prints, bit for
    bit) and holds it to the committed ``committed``, within ``tolerance`` (stated on the cell). The plugin compares
    the same two texts as on the template's own cell, and the kernel starts no ranks: the comparison, not the run,
    is what these copies test (the template's run is the strict test's)."""
    text = "".join(_first_output_text())
    metadata = {"commhooks_lab": {"tolerance": tolerance}}
    return write_notebook(
        tmp_path / f"{name}.ipynb", [(f"print({text!r}, end='')", [stream("".join(committed))], metadata)]
    )


def _moved_within(tmp_path: Path) -> Path:
    """The template's first output with its decimals moved by 4 %, held to rtol=0.1: tolerant passes, strict fails."""
    within = _nudged(_first_output_text(), 1.04)
    assert within != _first_output_text()
    return _printing(tmp_path, "within", within, {"rtol": 0.1, "why": "test"})


def test_tolerant_mode_passes_moves_within_the_tolerance_and_fails_the_rest(tmp_path):
    """One tolerant run over two one-cell copies of the template's first output: moved within the tolerance
    (passes; strict fails it: the template test above), and moved beyond it with an integer changed too (fails,
    saying both; that a large rtol does not excuse an integer is the unit test's). The cells run in a pytest-xdist
    worker, as under the README's test command, and only their reports reach the process that prints the closing
    table: it still names each copy. One worker takes the same path as two (each report travels on its own) for
    one interpreter's start less."""
    broken = [line.replace("bytes per step ", "bytes per step 1") for line in _nudged(_first_output_text(), 1.5)]
    copies = [
        _moved_within(tmp_path),
        _printing(tmp_path, "beyond", broken, {"rtol": 0.1}),
    ]
    out = nbval(copies, "-n", "1", tolerant=True).stdout
    failed = failed_notebooks(out)
    assert failed == {"beyond.ipynb"}, out[-3000:]
    assert "beyond the tolerance (rtol=0.1" in out and "(integers must match exactly)" in out
    table = out[out.index("numbers that moved (--lab-tolerant)") :]
    assert re.search(r"^ok +within\.ipynb::Cell \d+: \d+ numbers moved", table, re.M), table
    assert re.search(r"^FAILED +beyond\.ipynb::Cell \d+: \d+ numbers moved", table, re.M), table


# -- the figure check every kernel of the suite starts with --------------------------------------------------------

FIGURE = """import runpy, sys
runpy.run_path(sys.argv[1])
print("pyplot imported:", "matplotlib.pyplot" in sys.modules)
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot([0, 1], [0, 1])
try:
    plt.show()
except AssertionError as e:
    print(type(e).__name__, str(e).splitlines()[0])
"""


def test_the_kernels_startup_imports_no_pyplot_and_checks_figures_once_a_cell_imports_it(tmp_path):
    """The IPython startup file the suite gives every kernel (``tests/conftest.py``) leaves pyplot unimported,
    and a figure shown after a cell imports pyplot is still checked. A plain interpreter runs the file as IPython
    would (a kernel adds nothing to what is tested here, and seconds of CPU)."""
    from commhooks_lab.testing.figure_layout import write_ipython_startup

    write_ipython_startup(tmp_path)
    startup = next((tmp_path / "profile_default" / "startup").glob("*.py"))
    env = {**os.environ, "MPLBACKEND": "Agg"}
    env.pop("COMMHOOKS_LAB_FIGURE_REPORT", None)
    out = subprocess.run(
        [sys.executable, "-c", FIGURE, str(startup)], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.stdout.splitlines() == [
        "pyplot imported: False",
        "FigureLayoutError this figure does not read at a glance:",
    ], out.stdout + out.stderr


def test_where_pyplot_is_imported_already_its_show_is_checked_at_once(monkeypatch):
    import matplotlib.pyplot as plt

    from commhooks_lab.testing.figure_layout import check_when_imported

    monkeypatch.setattr(plt, "show", lambda *args, **kwargs: None)
    check_when_imported()
    assert getattr(plt.show, "_checks_layout", False)

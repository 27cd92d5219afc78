"""``scripts/execute_notebooks.py`` writes every notebook asked for or none, and installs what they recorded."""

import json
import sys
from pathlib import Path

import nbformat
import pytest

from commhooks_lab.studies import recorded

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import execute_notebooks  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def _notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_when_one_notebook_fails_none_is_written_and_the_failure_is_named(tmp_path, capsys):
    first = _notebook(tmp_path / "01_fine.ipynb", "print(1)")
    broken = _notebook(tmp_path / "02_broken.ipynb", "raise ValueError('a lesson that breaks')")
    last = _notebook(tmp_path / "03_fine.ipynb", "print(3)")
    before = {path: path.read_bytes() for path in (first, broken, last)}
    assert execute_notebooks.main([str(first), str(broken), str(last)]) == 1
    assert {path: path.read_bytes() for path in before} == before  # 01 ran, and is not half of a re-execution
    out, err = capsys.readouterr()
    assert "FAILED  " in out and "a lesson that breaks" in out and "03_fine.ipynb" in out  # 03 still ran
    assert f"1 of 3 notebooks failed: {broken}. Nothing was written" in err


def test_a_notebooks_runs_behind_links_are_installed_with_its_code_digest_and_machine_notes_go(tmp_path, monkeypatch):
    """(Its kernel imports the lab for a note and a recording only: no rank server is prewarmed for it.)"""
    monkeypatch.setattr(recorded, "DIRECTORY", tmp_path / "recorded")
    monkeypatch.setenv("COMMHOOKS_LAB_PREWARM", "0")
    path = _notebook(
        tmp_path / "08_links.ipynb",
        "from commhooks_lab.launcher import notes\nnotes.say('demo', 'about this machine')\nprint(2)",
        "from commhooks_lab.studies import recorded\nrecorded.keep('time_hooks', {'links': ('a',)}, {'ms': 1 / 3})",
    )
    assert execute_notebooks.main([str(path)]) == 0
    saved = nbformat.read(path, as_version=4)
    assert [o.get("text") for o in saved.cells[0].outputs] == ["2\n"]  # the note was the machine's, not the lesson's
    installed = json.loads((tmp_path / "recorded" / "08_links.json").read_text())
    assert installed["code_sha256"] == recorded.code_digest(saved)
    assert [(r["study"], r["arguments"], r["data"]) for r in installed["runs"]] == [
        ("time_hooks", {"links": ["a"]}, {"ms": 1 / 3})
    ]


@pytest.mark.parametrize("links_here", [True, False])
def test_a_recording_nothing_remade_goes_where_links_build_and_stays_where_they_cannot(
    tmp_path, monkeypatch, capsys, links_here
):
    """Where links build, a notebook that recorded nothing makes no runs behind links: its old recording would be
    stale. Where they cannot, its runs were replays of that recording, which must stay."""
    from commhooks_lab.launcher import netns_switch

    refused = None if links_here else "no namespaces (simulated)"
    monkeypatch.setattr(netns_switch, "facts", lambda: {"refused": refused, "way_out": "none", "netem": False})
    monkeypatch.setattr(recorded, "DIRECTORY", tmp_path / "recorded")
    (tmp_path / "recorded").mkdir()
    old = tmp_path / "recorded" / "11_race.json"
    old.write_text('{"runs": []}')
    assert execute_notebooks.main([str(_notebook(tmp_path / "11_race.ipynb", "print(11)"))]) == 0
    assert old.exists() is not links_here
    assert ("recording is removed" if links_here else "its recording stays as it was") in capsys.readouterr().out

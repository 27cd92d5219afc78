"""scripts/record_variants.py records another build's outputs only for cells that declare the fact they depend on."""

import json
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import load_script

from commhooks_lab.testing import machine_outputs

CPU = {"torch_build": "cpu", "user_namespaces": True}
CUDA = {"torch_build": "cuda", "user_namespaces": True}
BUILD = {"commhooks_lab": {"depends_on": {"torch_build": "DDP's bf16 check reads the build"}}}


def _stream(text: str) -> dict:
    return nbformat.v4.new_output("stream", name="stdout", text=text)


@pytest.mark.parametrize(
    "metadata, differs, there, expected",
    [
        (BUILD, True, CUDA, ("record", {"torch_build": "cuda"})),
        ({}, True, CUDA, ("refuse", "declares no fact")),
        (BUILD, True, {**CPU, "user_namespaces": False}, ("refuse", "both machines have the facts it declares")),
        ({}, False, CUDA, ("same", None)),
        (BUILD, False, CUDA, ("same", None)),
    ],
)
def test_only_a_difference_in_a_declared_fact_is_recorded(metadata, differs, there, expected):
    action, detail = machine_outputs.what_to_record(metadata, differs, CPU, there)
    assert action == expected[0]
    assert detail == expected[1] if not isinstance(expected[1], str) else expected[1] in detail


def test_a_variant_that_no_longer_differs_is_dropped_and_one_is_kept_per_when():
    metadata = json.loads(json.dumps(BUILD))
    machine_outputs.set_variant(metadata, {"torch_build": "cuda"}, [_stream("old\n")])
    machine_outputs.set_variant(metadata, {"torch_build": "cuda"}, [_stream("new\n")])
    (variant,) = metadata["commhooks_lab"]["outputs_when"]
    assert variant["outputs"][0]["text"] == "new\n"
    assert machine_outputs.what_to_record(metadata, False, CPU, CUDA) == ("drop", {"torch_build": "cuda"})
    machine_outputs.set_variant(metadata, {"torch_build": "cuda"}, None)
    assert "outputs_when" not in metadata["commhooks_lab"] and "depends_on" in metadata["commhooks_lab"]
    with pytest.raises(ValueError, match="unknown facts"):
        machine_outputs.set_variant(metadata, {"gpu": True}, [])


def _notebook(path: Path, cells: list[tuple[str, dict]]) -> None:
    nb = nbformat.v4.new_notebook()
    for number, (text, metadata) in enumerate(cells, 1):
        cell = nbformat.v4.new_code_cell(f"print({text!r})", metadata=json.loads(json.dumps(metadata)))
        cell.execution_count, cell.outputs = number, [_stream(text)]
        nb.cells.append(cell)
    nbformat.write(nb, path)


@pytest.fixture
def other_python(tmp_path, monkeypatch):
    """An 'interpreter' that answers the facts question as a CUDA build would (it is asked nothing else with
    ``--executed``); this machine is held to be a CPU build."""
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho '{json.dumps({**CUDA, 'torch': '2.13.0+cu130'})}'\n")
    fake.chmod(0o755)
    script = load_script("record_variants")
    monkeypatch.setattr(script, "machine_facts", lambda: CPU)
    return script, str(fake)


def test_the_script_records_the_declared_cell_and_writes_nothing_when_another_cell_differs(tmp_path, other_python):
    script, python = other_python
    committed, executed = tmp_path / "nb.ipynb", tmp_path / "run"
    executed.mkdir()
    _notebook(committed, [("same\n", {}), ("refused\n", BUILD)])
    _notebook(executed / "nb.ipynb", [("same\n", {}), ("registered\n", BUILD)])
    assert script.main(["--python", python, "--executed", str(executed), str(committed)]) == 0
    cells = nbformat.read(committed, as_version=4).cells
    assert cells[0].metadata == {} and cells[1].outputs[0]["text"] == "refused\n"
    (variant,) = cells[1].metadata["commhooks_lab"]["outputs_when"]
    assert variant["when"] == {"torch_build": "cuda"} and variant["outputs"][0]["text"] == "registered\n"
    assert machine_outputs.reference_outputs(cells[1].metadata, cells[1].outputs, CUDA)[0]["text"] == "registered\n"

    _notebook(executed / "nb.ipynb", [("changed\n", {}), ("registered\n", BUILD)])
    before = committed.read_bytes()
    assert script.main(["--python", python, "--executed", str(executed), str(committed)]) == 1
    assert committed.read_bytes() == before, "a refused cell leaves every notebook as it was"


def test_two_machines_with_the_same_facts_record_nothing(tmp_path):
    script = load_script("record_variants")
    _notebook(tmp_path / "nb.ipynb", [("x\n", BUILD)])
    assert script.main(["--python", sys.executable, "--executed", str(tmp_path), str(tmp_path / "nb.ipynb")]) == 1

"""Machine notes are never compared, and a cell's variant for this kind of machine is: strict nbval, real kernels."""

import json

import nbformat
import pytest
from test_testing import failed_notebooks, nbval

from commhooks_lab.launcher import notes
from commhooks_lab.testing import machine_outputs

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def _stream(text: str) -> dict:
    return nbformat.v4.new_output("stream", name="stdout", text=text)


def _note(text: str) -> dict:
    return nbformat.v4.new_output(
        "display_data", data={"text/plain": text}, metadata={notes.METADATA_KEY: "user_namespaces"}
    )


def test_notes_are_left_out_and_only_notes():
    kept = _stream("1\n")
    assert machine_outputs.without_notes([_note("a"), kept, _note("b")]) == [kept]


def test_the_variant_whose_facts_match_is_the_reference_and_unknown_facts_are_refused():
    committed = [_stream("refused\n")]
    meta = {"commhooks_lab": {"outputs_when": [{"when": {"torch_build": "cuda"}, "outputs": [_stream("ok\n")]}]}}
    assert machine_outputs.reference_outputs(meta, committed, {"torch_build": "cpu"}) == committed
    assert machine_outputs.reference_outputs(meta, committed, {"torch_build": "cuda"})[0]["text"] == "ok\n"
    assert machine_outputs.reference_outputs({}, committed, {"torch_build": "cuda"}) == committed
    meta["commhooks_lab"]["outputs_when"][0]["when"] = {"gpu_count": 1}
    with pytest.raises(ValueError, match="unknown facts"):
        machine_outputs.reference_outputs(meta, committed, {"torch_build": "cuda"})


def _variant(when: dict, outputs: list[dict]) -> dict:
    return {"commhooks_lab": {"outputs_when": [{"when": when, "outputs": outputs}]}}


def _notebook(path, cells: list[tuple[str, list[dict], dict]]) -> None:
    nb = nbformat.v4.new_notebook()
    for number, (source, outputs, metadata) in enumerate(cells, 1):
        cell = nbformat.v4.new_code_cell(source, metadata=metadata, execution_count=number)
        cell.outputs = outputs
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.write_text(json.dumps(nb))


def test_strict_nbval_leaves_notes_out_and_holds_each_build_to_its_own_outputs(tmp_path):
    """One notebook says a note the committed outputs lack (passes); a cell keeps the other build's output as a
    variant and this build's as its own (passes); a copy whose this-build output is wrong fails, and so does one
    whose only output for this build is the other build's (the variant does not excuse a wrong cell)."""
    import torch

    this, other = ("cuda", "cpu") if torch.version.cuda else ("cpu", "cuda")
    say = "from commhooks_lab.launcher import notes\nnotes.say_once('demo', 'links cannot be built here')\nprint(1)"
    show = "import torch\nprint('cuda' if torch.version.cuda else 'cpu')"
    variant = _variant({"torch_build": other}, [_stream(f"{other}\n")])
    _notebook(tmp_path / "good.ipynb", [(say, [_stream("1\n")], {}), (show, [_stream(f"{this}\n")], variant)])
    _notebook(tmp_path / "wrong.ipynb", [(show, [_stream("tpu\n")], variant)])
    swapped = _variant({"torch_build": this}, [_stream(f"{other}\n")])
    _notebook(tmp_path / "swapped.ipynb", [(show, [_stream(f"{this}\n")], swapped)])
    out = nbval([tmp_path / "good.ipynb", tmp_path / "wrong.ipynb", tmp_path / "swapped.ipynb"], "-rfp")
    assert failed_notebooks(out.stdout) == {"wrong.ipynb", "swapped.ipynb"}, out.stdout[-3000:] + out.stderr[-2000:]
    assert out.stdout.count("PASSED good.ipynb::") == 2, out.stdout[-3000:]

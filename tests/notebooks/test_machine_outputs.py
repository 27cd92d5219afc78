"""Machine notes are never compared, and a cell's variant for this kind of machine is: strict nbval, real kernels."""

import re
import subprocess
import sys

import nbformat
import pytest
from test_testing import nbval, stream, write_notebook

from commhooks_lab.launcher import notes
from commhooks_lab.testing import machine_outputs

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def _note(text: str) -> dict:
    return nbformat.v4.new_output(
        "display_data", data={"text/plain": text}, metadata={notes.METADATA_KEY: "user_namespaces"}
    )


def test_notes_are_left_out_and_only_notes():
    kept = stream("1\n")
    assert machine_outputs.without_notes([_note("a"), kept, _note("b")]) == [kept]


def test_the_variant_whose_facts_match_is_the_reference_and_unknown_facts_are_refused():
    committed = [stream("refused\n")]
    meta = {"commhooks_lab": {"outputs_when": [{"when": {"torch_build": "cuda"}, "outputs": [stream("ok\n")]}]}}
    assert machine_outputs.reference_outputs(meta, committed, {"torch_build": "cpu"}) == committed
    assert machine_outputs.reference_outputs(meta, committed, {"torch_build": "cuda"})[0]["text"] == "ok\n"
    assert machine_outputs.reference_outputs({}, committed, {"torch_build": "cuda"}) == committed
    meta["commhooks_lab"]["outputs_when"][0]["when"] = {"gpu_count": 1}
    with pytest.raises(ValueError, match="unknown facts"):
        machine_outputs.reference_outputs(meta, committed, {"torch_build": "cuda"})


def _variant(when: dict, outputs: list[dict]) -> dict:
    return {"commhooks_lab": {"outputs_when": [{"when": when, "outputs": outputs}]}}


def test_strict_nbval_leaves_notes_out_and_holds_each_build_to_its_own_outputs(tmp_path):
    """A cell says a note the committed outputs lack (passes); a cell keeps the other build's output as a variant
    and this build's as its own (passes); a cell whose this-build output is wrong fails, and so does one whose only
    output for this build is the other build's (the variant does not excuse a wrong cell). One notebook holds all
    four (nbval judges each cell on its own; a failed comparison does not stop the kernel), and its cells print
    this build's name as the test process reads it: the kernel imports no torch, and no rank server starts."""
    import torch

    this, other = ("cuda", "cpu") if torch.version.cuda else ("cpu", "cuda")
    say = "from commhooks_lab.launcher import notes\nnotes.say_once('demo', 'links cannot be built here')\nprint(1)"
    show = f"print({this!r})"
    variant = _variant({"torch_build": other}, [stream(f"{other}\n")])
    swapped = _variant({"torch_build": this}, [stream(f"{other}\n")])
    cells = [
        (say, [stream("1\n")], {}),
        (show, [stream(f"{this}\n")], variant),
        (show, [stream("tpu\n")], variant),
        (show, [stream(f"{this}\n")], swapped),
    ]
    out = nbval([write_notebook(tmp_path / "builds.ipynb", cells)], "-rfp", prewarm=False).stdout
    verdicts = {cell: verdict for verdict, cell in re.findall(r"^(PASSED|FAILED) builds\.ipynb::Cell (\d)", out, re.M)}
    assert verdicts == {"0": "PASSED", "1": "PASSED", "2": "FAILED", "3": "FAILED"}, out[-3000:]


def test_the_build_is_read_without_importing_torch_and_as_torch_says_it():
    """nbval's process reads the build from torch's ``version.py`` (importing torch would cost it seconds): the
    same answer as ``torch.version.cuda``, and torch stays unimported."""
    import torch

    code = (
        "import sys; from commhooks_lab.testing.machine_outputs import machine_fact; "
        "print(machine_fact('torch_build'), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["cuda" if torch.version.cuda else "cpu", "False"], out.stdout + out.stderr

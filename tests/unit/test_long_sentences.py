"""scripts/long_sentences.py counts what a reader reads: prose sentences, without code, formulas or tables."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "long_sentences.py"
spec = importlib.util.spec_from_file_location("long_sentences", SCRIPT)
assert spec is not None and spec.loader is not None
long_sentences = importlib.util.module_from_spec(spec)
spec.loader.exec_module(long_sentences)


def test_code_formulas_headings_and_tables_are_not_counted_and_sentences_are_split():
    text = (
        "# A heading of many words that is not a sentence at all\n\n"
        "The hook casts to `torch.float16` and sums $\\sum_r g_r / W$ over ranks. It then returns.\n\n"
        "| a | table | row |\n|---|---|---|\n\n"
        "- a list item with four words\n- another item here\n\n"
        "```python\nprint('code is not prose, however long it is, and it never counts as a sentence here')\n```\n"
    )
    found = long_sentences.sentences(text)
    assert found == [
        "The hook casts to code and sums formula over ranks.",
        "It then returns.",
        "a list item with four words",
        "another item here",
    ]
    assert [long_sentences.words(s) for s in found] == [10, 3, 6, 3]


def test_the_count_runs_on_the_course(capsys):
    assert long_sentences.main([]) == 0
    out = capsys.readouterr().out
    assert "01_quickstart.ipynb" in out and "GLOSSARY.md" in out and out.splitlines()[-1].startswith("all")


def test_the_course_keeps_issue_32s_voice(capsys):
    """At most 10 sentences over 40 words in the whole course, and no file name, PR or issue number left in a
    lesson's prose (scripts/references_in_prose.py: they belong in the section's Sources cell)."""
    long_sentences.main([])
    assert int(capsys.readouterr().out.splitlines()[-1].split()[-1]) <= 10
    spec = importlib.util.spec_from_file_location("references_in_prose", SCRIPT.parent / "references_in_prose.py")
    assert spec is not None and spec.loader is not None
    references = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(references)
    assert references.main([]) == 0, capsys.readouterr().out
    text = "We measured it (`torch/nn/parallel/distributed.py`, PR #12345). Run `python bench/links.py` to see."
    import nbformat

    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell(text), nbformat.v4.new_markdown_cell("**Sources**\n\n- `a.py`, #4567")]
    )
    assert [r for _, r in references.references(nb)] == ["torch/nn/parallel/distributed.py", "#12345"]

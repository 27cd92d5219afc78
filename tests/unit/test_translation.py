"""The course in another language (issue 52): paragraphs as gettext messages, fuzzy when the English changes, and a
translated notebook that is the English one but for its finished paragraphs."""

import json
from pathlib import Path

import nbformat
import pytest

from commhooks_lab.course import translation as tr

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_markdown_cell_cuts_into_pieces_that_join_to_it_and_code_is_never_a_message(path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            parts = list(tr.pieces(cell.source))
            assert "".join(text for _, text in parts) == cell.source
            assert all(not text.lstrip().startswith(("```", "~~~")) for kind, text in parts if kind == "text")
    assert all("```" not in message for _, message in tr.messages(notebook))


def _write(catalog, path: Path) -> None:
    from babel.messages.pofile import write_po

    with open(path, "wb") as f:
        write_po(f, catalog)


def test_a_changed_english_paragraph_turns_fuzzy_and_shows_in_english_until_updated(tmp_path):
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# Title\n\nRanks are processes.\n\n```python\nx = 1\n```\n\nSee `ddp`."),
            nbformat.v4.new_code_cell("print(1)"),
        ]
    )
    po = tmp_path / "nb.po"
    tr.update_catalog(po, tr.template("nb", notebook))
    catalog = tr.read_catalog(po)
    assert [m.id for m in catalog if m.id] == ["# Title", "Ranks are processes.", "See `ddp`."]
    for message, korean in zip([m for m in catalog if m.id], ["# 제목", "랭크는 프로세스입니다.", "`ddp`를 보세요."]):
        message.string = korean
    _write(catalog, po)
    korean = tr.translate_notebook(notebook, tr.read_catalog(po))
    assert korean.cells[0].source == (
        '<a id="Title"></a>\n\n# 제목\n\n랭크는 프로세스입니다.\n\n```python\nx = 1\n```\n\n`ddp`를 보세요.'
    )
    assert korean.cells[1] == notebook.cells[1] and tr.counts(tr.read_catalog(po)) == tr.Counts(3, 0, 0)

    notebook.cells[0].source = notebook.cells[0].source.replace("Ranks are processes.", "Ranks are OS processes.")
    tr.update_catalog(po, tr.template("nb", notebook))
    assert tr.counts(tr.read_catalog(po)) == tr.Counts(2, 1, 0)
    again = tr.translate_notebook(notebook, tr.read_catalog(po))
    assert "Ranks are OS processes." in again.cells[0].source and "# 제목" in again.cells[0].source


@pytest.mark.parametrize(
    ("translation", "problem"),
    [
        ("넓은 MLP는 30단계, 2개의 랭크에서 `fp16`으로 [여기](a.md#x)를 봅니다.", None),
        ("넓은 MLP는 3단계, 2개의 랭크에서 `fp16`으로 [여기](a.md#x)를 봅니다.", "number missing: 30"),
        ("넓은 MLP는 30단계, 2개의 랭크에서 fp16으로 [여기](a.md#x)를 봅니다.", "inline code missing: `fp16`"),
        ("넓은 MLP는 30단계, 2개의 랭크에서 `fp16`으로 [여기](a.md#y)를 봅니다.", "link target missing: a.md#x"),
        ("넓은 MLP는 30단계, 2개의 랭크에서 `bf16`으로 [여기](a.md#x)를 봅니다.", "inline code not in the English"),
    ],
)
def test_a_translation_keeps_every_number_code_span_and_link_of_its_source(translation, problem):
    source = "The wide MLP trains 30 steps on 2 ranks with `fp16`: see [here](a.md#x)."
    problems = tr.faithfulness_problems(source, translation)
    assert problems == [] if problem is None else any(p.startswith(problem) for p in problems), problems
    assert tr.faithfulness_problems("1,126,410 parameters", "매개변수 1126410개") == []


def test_the_glossarys_anchors_and_bare_urls_count_too():
    source = '<a id="rank"></a>**Rank**: one process of the job (https://pytorch.org/docs).'
    korean = '<a id="rank"></a>**랭크**: 작업의 프로세스 하나 (https://pytorch.org/docs).'
    assert tr.faithfulness_problems(source, korean) == []
    assert tr.faithfulness_problems(source, korean.replace('<a id="rank"></a>', "")) == [
        'HTML tag missing: </a>, <a id="rank">'
    ]
    assert tr.faithfulness_problems(source, korean.replace(" (https://pytorch.org/docs)", "")) == [
        "link target missing: https://pytorch.org/docs"
    ]


def test_the_course_copies_out_in_korean_and_refuses_a_language_it_does_not_have(tmp_path):
    from commhooks_lab.course import copy_course
    from commhooks_lab.course.copy import CourseCopyError

    copy_course(tmp_path, lang="ko")
    for name in ("01_quickstart.ipynb", "15_the_hook_challenge.ipynb"):
        copied = nbformat.read(tmp_path / "notebooks" / name, as_version=4)
        english = nbformat.read(Path(__file__).parents[2] / "notebooks" / name, as_version=4)
        assert [c for c in copied.cells if c.cell_type == "code"] == [c for c in english.cells if c.cell_type == "code"]
    with pytest.raises(CourseCopyError, match="the course has no translation 'xx': choose one of 'en', 'ko'"):
        copy_course(tmp_path / "other", lang="xx")
    assert not (tmp_path / "other").exists()


def test_every_committed_translation_is_faithful_and_its_catalogue_follows_todays_english():
    """``scripts/translations.py check`` in the suite; and each catalogue holds every paragraph of its English file
    (``update`` was run since the English last changed), so ``stats`` counts what a learner sees."""
    root = Path(__file__).parents[2]
    for source in tr.translated_sources(root):
        path = tr.catalogue_path(root, "ko", source)
        catalog = tr.read_catalog(path)
        assert list(tr.catalogue_problems(catalog)) == [], path
        text = source.read_text(encoding="utf-8")
        document = json.loads(text) if source.suffix == ".ipynb" else text
        wanted = {message for _, message in tr.messages(document)}
        assert wanted <= {m.id for m in catalog if m.id}, f"{path}: run scripts/translations.py update"


def test_in_the_korean_course_every_link_to_a_heading_still_lands(tmp_path):
    """A translated heading gets a Korean anchor from JupyterLab; its English one is kept just before it, so the
    links between notebooks (unchanged in translation) still find it."""
    import re

    from commhooks_lab.course import copy_course, course_files

    copy_course(tmp_path, lang="ko")

    def anchors(path: Path) -> set[str]:
        if path.suffix == ".ipynb":
            text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
        else:
            text = path.read_text(encoding="utf-8")
        headings = {tr.heading_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}
        return set(re.findall(r'<a id="([^"]+)"', text)) | headings

    broken = []
    for name in course_files(tmp_path):
        if name.suffix not in (".ipynb", ".md"):
            continue
        text = (tmp_path / name).read_text()
        for target, anchor in re.findall(r"\]\(([\w./-]*\.(?:ipynb|md))?#([^)\s\"\\]+)\)", text):
            linked = (tmp_path / name).parent / target if target else tmp_path / name
            if linked.exists() and anchor not in anchors(linked):
                broken.append(f"{name} -> {target or '(itself)'}#{anchor}")
    assert broken == []
    korean = nbformat.read(tmp_path / "notebooks" / "01_quickstart.ipynb", as_version=4)
    assert re.search("[가-힣]", korean.cells[0].source), "notebook 1 is translated"

"""The course in another language, from the English notebooks and gettext catalogues (issue 52).

The English notebooks stay the source. Each markdown cell is cut into paragraphs (blocks between blank lines;
a fenced code block is one block and is never translated), and each paragraph is one gettext message, so a
changed English paragraph marks its translation fuzzy (babel's catalogue update, the one ``sphinx-intl`` runs).
A translated notebook is the English one with each paragraph replaced by its translation where there is one, not
fuzzy: code cells, their outputs and the metadata are the same bits, so the notebook regression holds.

Sphinx's own i18n translates the site's doctree, after MyST has parsed the markdown; the notebooks a learner opens
in JupyterLab need the markdown itself, so the messages are cut here, once, for both.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Counts",
    "catalogue_path",
    "counts",
    "faithfulness_problems",
    "heading_anchor",
    "languages",
    "markdown_messages",
    "messages",
    "pieces",
    "read_catalog",
    "template",
    "translate_markdown",
    "translate_notebook",
    "translate_file",
    "translate_notebook_file",
    "translated_sources",
    "update_catalog",
]

_FENCE = re.compile(r"^\s*(```|~~~)")
#: What must be the same in a translation as in its English source: inline code, link targets, math, numbers.
_CODE = re.compile(r"`[^`]+`")  # may run over a line break, as markdown allows
_LINK_TARGET = re.compile(r"\]\(([^)\s]+)[^)]*\)")
_URL = re.compile(r"https?://[^\s)>\]]+")
_MATH = re.compile(r"\$[^$]+\$")
_HTML = re.compile(r"<[A-Za-z/][^<>]*>")
#: Digits not inside a name (fp16, r4); Korean particles may follow them ("30단계"), so only Latin letters count.
_NUMBER = re.compile(r"(?<![A-Za-z0-9_.])[-+−]?\d+(?:[.,]\d+)*(?![A-Za-z0-9_])")


def pieces(markdown: str) -> Iterator[tuple[str, str]]:
    """``(kind, text)`` in order, ``kind`` one of ``text``, ``code`` (a fenced block) and ``blank``; their texts
    joined are ``markdown`` again."""
    lines = markdown.splitlines(keepends=True)
    block: list[str] = []
    fence: str | None = None
    for line in lines:
        if fence is not None:
            block.append(line)
            if line.strip().startswith(fence) and len(block) > 1:
                yield "code", "".join(block)
                block, fence = [], None
            continue
        opened = _FENCE.match(line)
        if opened or not line.strip():
            if block:
                yield "text", "".join(block)
                block = []
            if opened:
                fence = opened.group(1)
                block = [line]
            else:
                yield "blank", line
            continue
        block.append(line)
    if block:
        yield ("code" if fence is not None else "text"), "".join(block)


def _message(text: str) -> str | None:
    """The paragraph as its message (without its line end), or None when it has no words to translate."""
    body = text.rstrip("\n")
    bare = _URL.sub("", _LINK_TARGET.sub("]", _CODE.sub("", _MATH.sub("", body))))
    return body if re.search(r"[A-Za-z]{2}", bare) else None


def markdown_messages(markdown: str) -> Iterator[str]:
    """Every translatable paragraph of a markdown text, in order."""
    for kind, text in pieces(markdown):
        message = _message(text) if kind == "text" else None
        if message is not None:
            yield message


def messages(document) -> Iterator[tuple[int, str]]:
    """``(cell index, message)`` for every translatable paragraph of a notebook's markdown cells (a dict, as
    ``json`` or ``nbformat`` reads it), or ``(0, message)`` for a markdown text's."""
    if isinstance(document, str):
        yield from ((0, message) for message in markdown_messages(document))
        return
    for index, cell in enumerate(document["cells"]):
        if cell["cell_type"] == "markdown":
            yield from ((index, message) for message in markdown_messages(_source(cell)))


def _source(cell) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def template(name: str, notebook):
    """The catalogue template (a ``babel.messages.Catalog``) of one notebook or markdown text: each paragraph
    once, with the cells it stands in as its locations."""
    from babel.messages.catalog import Catalog

    catalog = Catalog(project="commhooks_lab", version=None, domain=name, fuzzy=False)
    for index, message in messages(notebook):
        catalog.add(message, locations=[(name, index)])
    return catalog


def read_catalog(path: str | Path, locale: str = "ko"):
    from babel.messages.pofile import read_po

    with open(path, "rb") as f:
        return read_po(f, locale=locale)


def update_catalog(path: str | Path, fresh, locale: str = "ko") -> None:
    """Bring the catalogue at ``path`` to the template ``fresh``: new paragraphs missing, changed ones fuzzy (their
    old translation kept to edit), gone ones obsolete; made if absent."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    path = Path(path)
    if path.exists():
        catalog = read_catalog(path, locale)
    else:
        catalog = Catalog(locale=locale, domain=fresh.domain, project="commhooks_lab", fuzzy=False)
    before = _contents(catalog) if path.exists() else None
    catalog.update(fresh, update_header_comment=False)
    if _contents(catalog) == before:
        return  # the English did not change: the file stays as it is (no new date in its header)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        write_po(f, catalog, width=0, omit_header=False, sort_output=False, include_previous=True)


def _contents(catalog) -> list:
    return [(m.id, m.string, m.fuzzy, m.previous_id) for m in catalog if m.id] + [
        (m.id, m.string) for m in catalog.obsolete.values()
    ]


def _translations(catalog) -> dict[str, str]:
    """Finished translations only: a fuzzy or empty one shows the English."""
    return {m.id: m.string for m in catalog if m.id and m.string and not m.fuzzy}


_HEADING = re.compile(r"#{1,6} (.+)")


def heading_anchor(heading: str) -> str:
    """The anchor JupyterLab (and the course's site, ``docs/site/heading_slugs.py``) gives a markdown heading: its
    shown text, code marks dropped, each run of spaces a ``-``."""
    return "-".join(heading.replace("`", "").split())


def translate_markdown(markdown: str, translations: dict[str, str]) -> str:
    """``markdown`` with each paragraph that has a translation replaced. A translated heading keeps its English
    anchor as an explicit one just before it, so links to it from other notebooks still land."""
    out = []
    for kind, text in pieces(markdown):
        message = _message(text) if kind == "text" else None
        if message is None or message not in translations:
            out.append(text)
            continue
        heading = _HEADING.fullmatch(message)
        if heading is not None:
            out.append(f'<a id="{heading_anchor(heading.group(1))}"></a>\n\n')
        out.append(translations[message] + text[len(message) :])
    return "".join(out)


def translate_notebook(notebook, catalog):
    """A copy of ``notebook`` (a dict, as ``json`` or ``nbformat`` reads it) with its markdown in the catalogue's
    language, paragraph by paragraph; every code cell, output and metadata the same."""
    translations = _translations(catalog)
    translated = copy.deepcopy(notebook)
    for cell in translated["cells"]:
        if cell["cell_type"] == "markdown":
            text = translate_markdown(_source(cell), translations)
            cell["source"] = text if isinstance(cell["source"], str) else text.splitlines(keepends=True)
    return translated


def translate_notebook_file(data: bytes, catalog) -> bytes:
    """A notebook file's bytes translated, written as the course writes its notebooks (JSON, indent 1, UTF-8), so
    that only markdown cells differ from the English file."""
    notebook = json.loads(data)
    return (json.dumps(translate_notebook(notebook, catalog), indent=1, ensure_ascii=False) + "\n").encode()


#: The English files the course translates, relative to its root (a clone's, or the wheel's ``course`` folder).
TRANSLATED = ("notebooks/*.ipynb", "notebooks/GLOSSARY.md")


def translated_sources(root: Path) -> list[Path]:
    return sorted(p for pattern in TRANSLATED for p in root.glob(pattern) if p.is_file())


def catalogue_path(root: Path, lang: str, source: Path) -> Path:
    """``locale/ko/LC_MESSAGES/notebooks/01_quickstart.po`` for ``notebooks/01_quickstart.ipynb``."""
    relative = source.relative_to(root) if source.is_absolute() else source
    return root / "locale" / lang / "LC_MESSAGES" / relative.with_suffix(".po")


def languages(root: Path) -> list[str]:
    """The languages the course has catalogues for."""
    return sorted(p.name for p in (root / "locale").glob("*") if (p / "LC_MESSAGES").is_dir())


def translate_file(root: Path, lang: str, name: Path, data: bytes) -> bytes:
    """The course file ``name`` (relative to ``root``, its bytes ``data``) in ``lang``: a notebook or the glossary
    with its catalogue's finished paragraphs, anything else (or a file without a catalogue) as it is."""
    catalogue = catalogue_path(root, lang, name)
    if not catalogue.exists():
        return data
    catalog = read_catalog(catalogue, lang)
    if name.suffix == ".ipynb":
        return translate_notebook_file(data, catalog)
    return translate_markdown(data.decode("utf-8"), _translations(catalog)).encode("utf-8")


@dataclass(frozen=True)
class Counts:
    translated: int
    fuzzy: int
    missing: int

    @property
    def total(self) -> int:
        return self.translated + self.fuzzy + self.missing

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.translated + other.translated, self.fuzzy + other.fuzzy, self.missing + other.missing)


def counts(catalog) -> Counts:
    """Translated (and not fuzzy), fuzzy, and missing messages of a catalogue (the header left out)."""
    rows = [m for m in catalog if m.id]
    fuzzy = sum(1 for m in rows if m.fuzzy)
    missing = sum(1 for m in rows if not m.string)
    return Counts(len(rows) - fuzzy - missing, fuzzy, missing)


def _marks(text: str) -> dict[str, Counter]:
    code = _CODE.findall(text)
    math = _MATH.findall(text)
    targets = _LINK_TARGET.findall(text) + _URL.findall(_LINK_TARGET.sub("] ", _CODE.sub(" ", text)))
    tags = _HTML.findall(_CODE.sub(" ", text))
    rest = _HTML.sub(" ", _URL.sub(" ", _LINK_TARGET.sub("] ", _CODE.sub(" ", _MATH.sub(" ", text)))))
    return {
        "inline code": Counter(code),
        "math": Counter(math),
        "link target": Counter(targets),
        "HTML tag": Counter(tags),
        "number": Counter(n.replace("−", "-").replace(",", "") for n in _NUMBER.findall(rest)),
    }


def faithfulness_problems(source: str, translation: str) -> list[str]:
    """What a translation lost or added against its English source: each inline code span, math span, link target
    (or bare URL), HTML tag (the glossary's anchors) and number must appear as often in both (a number's thousands
    separator may go)."""
    problems = []
    theirs, ours = _marks(source), _marks(translation)
    for kind in theirs:
        lost, added = theirs[kind] - ours[kind], ours[kind] - theirs[kind]
        if lost:
            problems.append(f"{kind} missing: {', '.join(sorted(lost))}")
        if added:
            problems.append(f"{kind} not in the English: {', '.join(sorted(added))}")
    return problems


def catalogue_problems(catalog) -> Iterable[tuple[str, list[str]]]:
    """``(message, problems)`` for each finished translation that is not faithful to its source."""
    for source, translation in _translations(catalog).items():
        problems = faithfulness_problems(source, translation)
        if problems:
            yield source, problems

"""The course's translations: gettext catalogues of the English notebooks and glossary, one message a paragraph.

    python scripts/translations.py update [--lang ko]   # catalogues brought to today's English (changed: fuzzy)
    python scripts/translations.py stats  [--lang ko]   # translated, fuzzy and missing messages per file
    python scripts/translations.py check  [--lang ko]   # every number, code span, math and link kept

The catalogues live in ``locale/LANG/LC_MESSAGES/`` under the English file's path (``notebooks/01_quickstart.po``).
Edit them with any gettext editor (Poedit, Lokalize) or by hand; ``commhooks-lab notebooks DIR --lang ko`` writes the
course with them. See ``docs/reference/translations.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from commhooks_lab.course import translation  # noqa: E402


def sources() -> list[Path]:
    """The English files translated, relative to the repository's root."""
    return [p.relative_to(ROOT) for p in translation.translated_sources(ROOT)]


def _document(path: Path):
    text = (ROOT / path).read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".ipynb" else text


def update(lang: str) -> int:
    for path in sources():
        target = translation.catalogue_path(ROOT, lang, path)
        translation.update_catalog(target, translation.template(path.stem, _document(path)), lang)
        print(f"{target.relative_to(ROOT)}: {translation.counts(translation.read_catalog(target, lang))}")
    return 0


def stats(lang: str) -> int:
    rows, total = [], translation.Counts(0, 0, 0)
    for path in sources():
        target = translation.catalogue_path(ROOT, lang, path)
        if not target.exists():
            count = translation.Counts(0, 0, sum(1 for _ in translation.messages(_document(path))))
        else:
            count = translation.counts(translation.read_catalog(target, lang))
        rows.append((str(path), count))
        total = total + count
    width = max(len(name) for name, _ in rows)
    print(f"{'file':<{width}}  translated  fuzzy  missing  done")
    for name, count in [*rows, ("all", total)]:
        share = 100 * count.translated / count.total if count.total else 100.0
        print(f"{name:<{width}}  {count.translated:>10}  {count.fuzzy:>5}  {count.missing:>7}  {share:>3.0f} %")
    return 0


def check(lang: str) -> int:
    bad = 0
    for path in sources():
        target = translation.catalogue_path(ROOT, lang, path)
        if not target.exists():
            continue
        for source, problems in translation.catalogue_problems(translation.read_catalog(target, lang)):
            bad += 1
            print(f"{target.relative_to(ROOT)}: {source[:70]!r}...: {'; '.join(problems)}")
    print(
        f"{bad} translation(s) not faithful to their English"
        if bad
        else "every translation keeps its numbers, code and links"
    )
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["update", "stats", "check"])
    parser.add_argument("--lang", default="ko")
    args = parser.parse_args(argv)
    return {"update": update, "stats": stats, "check": check}[args.command](args.lang)


if __name__ == "__main__":
    sys.exit(main())

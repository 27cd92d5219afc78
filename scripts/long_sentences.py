"""Count the course's long sentences: markdown split at sentence ends, code and formulas left out.

    python scripts/long_sentences.py [--over 40] [--show] [notebooks/01_quickstart.ipynb ...]

Prints, per notebook (and for notebooks/GLOSSARY.md, README.md and docs/teaching.md), the sentences, their mean
length in words and how many run over ``--over`` words; ``--show`` lists those. Issue 32's goal: at most 10 over
40 words in the whole course, sentences of about 20.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
#: Left out before splitting: fenced and inline code, display and inline formulas, links' targets, HTML anchors.
_DROP = [
    (re.compile(r"```.*?```", re.S), " "),
    (re.compile(r"\$\$.*?\$\$", re.S), " formula "),
    (re.compile(r"\$[^$\n]+\$"), " formula "),
    (re.compile(r"`[^`\n]+`"), " code "),
    (re.compile(r"\]\([^)]*\)"), "]"),
    (re.compile(r"<[^>]+>"), " "),
    (re.compile(r"^\s*[#|].*$", re.M), " "),  # headings and table rows are not sentences
]
#: A sentence ends at . ! ? or a colon before a list, followed by a space and a capital (or code), a list item or
#: a new paragraph.
_END = re.compile(r"(?<=[.!?])[*\"')’]*\s+(?=[A-Z(\"'*]|code\b)|\n\s*\n|\n\s*[-*]\s+|\n\s*\d+\.\s+")
_ITEM = re.compile(r"^(?:[-*]|\d+\.)\s+")
_WORD = re.compile(r"[A-Za-z0-9][\w'’.-]*")


def sentences(markdown: str) -> list[str]:
    text = markdown
    for pattern, replacement in _DROP:
        text = pattern.sub(replacement, text)
    parts = (_ITEM.sub("", " ".join(p.split())) for p in _END.split(text))
    return [p for p in parts if len(_WORD.findall(p)) >= 3]


def words(sentence: str) -> int:
    return len(_WORD.findall(sentence))


def markdown_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        return "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return path.read_text(encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--over", type=int, default=40)
    parser.add_argument("--show", action="store_true")
    args = parser.parse_args(argv)
    paths = args.paths or [
        *sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")),
        ROOT / "notebooks" / "GLOSSARY.md",
        ROOT / "README.md",
        ROOT / "docs" / "teaching.md",
    ]
    total_long = 0
    print(f"{'file':42s} {'sentences':>9s} {'mean words':>10s} {'over ' + str(args.over):>8s}")
    for path in paths:
        found = sentences(markdown_of(path))
        long = [s for s in found if words(s) > args.over]
        total_long += len(long)
        mean = sum(map(words, found)) / len(found) if found else 0.0
        print(f"{path.name:42s} {len(found):9d} {mean:10.1f} {len(long):8d}")
        if args.show:
            for s in long:
                print(f"    ({words(s)}) {s}")
    print(f"{'all':42s} {'':9s} {'':10s} {total_long:8d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

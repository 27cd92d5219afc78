"""The contributors' page names files that exist: a path in backticks that a rename left behind sends the next
contributor to a file that is not there."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "commhooks_lab"
#: A backticked token that names a file or folder: a slash in it, or a file's suffix, and no space.
PATH_LIKE = re.compile(r"^[\w.<>/-]+(/|\.(py|md|ipynb|json|toml|txt|cfg|sh))$|^[\w.<>-]+/[\w.<>/-]+$")


def named_paths(text: str) -> list[str]:
    """Backticked paths outside code blocks; ``<name>`` marks a file the reader makes, which need not exist."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    tokens = re.findall(r"`([^`\n]+)`", prose)
    return [t for t in tokens if PATH_LIKE.match(t) and "<" not in t and not t.startswith(("http", "-"))]


def missing(page: Path, *roots: Path) -> list[str]:
    return [p for p in named_paths(page.read_text(encoding="utf-8")) if not any((r / p).exists() for r in roots)]


def test_the_finder_sees_paths_and_skips_placeholders_commands_and_code():
    text = (
        "copy `commhooks_lab/hooks/wire16.py`, then `notebooks/<NN>_<topic>.ipynb`; run `pytest -m unit`; "
        "see `README.md` and `hooks/`.\n```bash\ncat `not/this.py`\n```\n`lab.run(hook=...)` `engine/gone.py`"
    )
    assert named_paths(text) == ["commhooks_lab/hooks/wire16.py", "README.md", "hooks/", "engine/gone.py"]


def test_every_path_the_contributors_page_names_exists():
    page = ROOT / "CONTRIBUTING.md"
    assert len(named_paths(page.read_text(encoding="utf-8"))) >= 30  # the page names the files to copy
    assert missing(page, ROOT) == []


def test_every_path_the_architecture_page_names_exists():
    """That page names files from the repository's root or from the package (``engine/ddp_job.py``)."""
    assert missing(ROOT / "docs" / "reference" / "architecture.md", ROOT, PACKAGE) == []


def test_the_readme_and_the_architecture_page_link_the_contributors_page():
    assert "](CONTRIBUTING.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`CONTRIBUTING.md`" in (ROOT / "docs" / "reference" / "architecture.md").read_text(encoding="utf-8")

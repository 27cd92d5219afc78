"""Build the course's website from the committed, executed notebooks: no cell runs.

    python scripts/build_site.py [--out build/site]

The pages are staged in ``build/site-src`` in the repository's own layout (``notebooks/`` beside
``docs/``), so every relative link the notebooks and docs use resolves on the site as in a clone.
Each lesson gains a box with the two commands that run it for real, taken from the README. The
dashboard's widget, which a static page cannot run, is shown as a picture of it in JupyterLab
(``docs/images/dashboard.png``, made by ``scripts/dashboard_picture.py``). Sphinx runs with
warnings as errors.
"""

from __future__ import annotations

import argparse
import base64
import re
import shutil
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
WIDGET = "application/vnd.jupyter.widget-view+json"
PICTURE = ROOT / "docs" / "images" / "dashboard.png"


def readme_commands() -> dict[str, str]:
    """The README's two commands, keyed by their marker (the same ones CI runs)."""
    text = (ROOT / "README.md").read_text()
    return dict(re.findall(r"<!-- command: (\w+) -->\s*```bash\n(.+?)\n```", text, flags=re.S))


def run_it_yourself(name: str) -> str:
    commands = readme_commands()
    return (
        ":::{admonition} Run this lesson yourself\n:class: tip\n\n"
        "From a clone of the repository, set up (once) and run the main job:\n\n"
        f"```bash\n{commands['setup']}\n```\n\n"
        f"then open this notebook with `.venv/bin/jupyter lab notebooks/{name}` and run it top to bottom. "
        "The whole test suite, these notebooks included:\n\n"
        f"```bash\n{commands['test']}\n```\n:::"
    )


def widget_picture() -> nbformat.NotebookNode:
    """What the page shows where the notebook showed a live widget: a picture of that widget in JupyterLab."""
    return nbformat.v4.new_output(
        "display_data",
        data={
            "image/png": base64.b64encode(PICTURE.read_bytes()).decode(),
            "text/plain": "the dashboard in JupyterLab after a click (a picture: run the notebook to use it)",
        },
    )


def stage_notebook(source: Path, target: Path) -> None:
    notebook = nbformat.read(source, as_version=4)
    first = next(i for i, c in enumerate(notebook.cells) if c.cell_type == "markdown")
    box = nbformat.v4.new_markdown_cell(run_it_yourself(source.name))
    if notebook.nbformat_minor < 5:  # cell ids came with nbformat 4.5; the course's notebooks are older
        box.pop("id")
    notebook.cells.insert(first + 1, box)
    for cell in notebook.cells:
        for i, output in enumerate(cell.get("outputs", [])):
            if WIDGET in output.get("data", {}):
                cell.outputs[i] = widget_picture()
    nbformat.write(notebook, target)


def myst_targets(markdown: str) -> str:
    """The glossary's HTML anchors (``<a id="rank"></a>``, which GitHub and JupyterLab honour) as MyST targets,
    so Sphinx knows them and checks every ``GLOSSARY.md#rank`` link."""
    return re.sub(r'^<a id="([\w-]+)"></a>$', r"(\1)=", markdown, flags=re.M)


def stage(src: Path) -> None:
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(ROOT / "docs" / "site", src)
    (src / "notebooks").mkdir()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        stage_notebook(notebook, src / "notebooks" / notebook.name)
    glossary = (ROOT / "notebooks" / "GLOSSARY.md").read_text()
    (src / "notebooks" / "GLOSSARY.md").write_text(myst_targets(glossary))
    shutil.copytree(ROOT / "docs", src / "docs", ignore=shutil.ignore_patterns("site"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site", help="folder for the HTML")
    args = parser.parse_args(argv)
    from sphinx.cmd.build import build_main

    src = ROOT / "build" / "site-src"
    stage(src)
    code = build_main(["-W", "--keep-going", "-q", "-b", "html", "-d", str(src / ".doctrees"), str(src), str(args.out)])
    if code == 0:
        print(f"the site is in {args.out}: open {args.out / 'index.html'}")
    return code


if __name__ == "__main__":
    sys.exit(main())

"""The course's website in a real browser: built from the committed notebooks, served, and every page opened.

Headless Debian Chromium through Playwright reads each page as a reader's browser would: what
failed to load, what the console said, which images have no pixels, which links lead nowhere
(a missing page, or an anchor the page does not have: the glossary's above all). Every request
that leaves the local server is refused and counted: the site must read offline.
"""

from __future__ import annotations

import functools
import http.server
import re
import subprocess
import sys
import threading
from urllib.parse import urldefrag, urljoin, urlparse

import nbformat
import pytest
from _jupyterlab import ROOT, browser_page

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built by scripts/build_site.py (warnings are errors: CI has no other build), served on a free
    local port."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "scripts/build_site.py", "--out", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield out, f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def pages(site):
    """Every page as the browser saw it: console messages, failed and outside requests, images, links, ids."""
    out, base = site
    seen = {}
    with browser_page() as page:
        outside: list[str] = []
        failed: list[str] = []

        def local_only(route) -> None:
            if route.request.url.startswith(base):
                route.continue_()
            else:
                outside.append(route.request.url)
                route.abort()

        page.route("**/*", local_only)
        page.on("requestfailed", lambda r: failed.append(r.url))
        page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: console.append(f"page error: {e}"))
        for html in sorted(out.rglob("*.html")):
            name = html.relative_to(out).as_posix()
            for kept in (outside, failed, console):
                kept.clear()
            page.goto(base + name, wait_until="networkidle")
            seen[name] = {
                "console": list(console),
                "failed": list(failed),
                "outside": list(outside),
                "images": page.eval_on_selector_all(
                    "article img", "els => els.map(e => [e.getAttribute('src'), e.naturalWidth])"
                ),
                "overflowing": page.eval_on_selector_all(  # an image wider than the text column is cut off
                    "article img",
                    "els => els.filter(e => e.getBoundingClientRect().right > "
                    "e.closest('article').getBoundingClientRect().right + 1).map(e => e.getAttribute('src'))",
                ),
                "links": page.eval_on_selector_all("article a[href]", "els => els.map(e => e.getAttribute('href'))"),
                "ids": set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)")),
                "text": page.inner_text("article"),
                "code": page.eval_on_selector_all("article div.cell_input", "els => els.map(e => e.innerText)"),
                "classes": page.eval_on_selector_all("article div.cell", "els => els.map(e => e.className)"),
            }
    return seen


def test_every_page_loads_offline_with_no_console_error(pages):
    assert len(pages) >= len(NOTEBOOKS) + 2
    problems = {name: {k: p[k] for k in ("console", "failed", "outside") if p[k]} for name, p in pages.items()}
    assert {name: p for name, p in problems.items() if p} == {}


def test_no_link_leads_nowhere(pages):
    broken = []
    for name, page in pages.items():
        for href in page["links"]:
            if re.match(r"[a-z]+:", href):
                continue  # the outside world: not followed, as the site must read without it
            target, anchor = urldefrag(urljoin(name, href))
            target = urlparse(target).path or name
            if target not in pages:
                broken.append(f"{name}: {href} (no such page)")
            elif anchor and anchor not in pages[target]["ids"]:
                broken.append(f"{name}: {href} (no #{anchor} there)")
    assert broken == []


def test_the_glossary_anchors_every_lesson_links_to_resolve(pages):
    wanted = {
        anchor
        for page in pages.values()
        for href in page["links"]
        if (anchor := urldefrag(href)[1]) and urldefrag(href)[0].endswith("GLOSSARY.html")
    }
    sources = [*NOTEBOOKS, *(ROOT / "docs").rglob("*.md")]
    linked = {a for f in sources for a in re.findall(r"GLOSSARY\.md#([\w-]+)", f.read_text())}
    assert wanted == linked and len(linked) > 20  # every anchor the lessons link to, as links on the site
    assert wanted - pages["notebooks/GLOSSARY.html"]["ids"] == set()


def test_the_site_shows_no_nbval_plumbing_in_a_code_cell(pages):
    """nbval's markers live in cell tags, which myst-nb turns into classes (``tag_nbval-ignore-output``), never text;
    a reader sees only the lesson's code."""
    shown = [
        f"{name}: {code[:60]!r}"
        for name, page in pages.items()
        for code in page["code"]
        if re.search(r"NBVAL_|nbval|# Why:", code)
    ]
    assert shown == []
    cells = sum(len(page["code"]) for page in pages.values())
    assert cells >= len(NOTEBOOKS) * 5, "code cells found on the lessons' pages"
    tagged = [c for page in pages.values() for c in page["classes"] if "tag_nbval-ignore-output" in c]
    assert tagged, "the tagged cells are on the pages, with their output"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_lesson_shows_its_figures_and_how_to_run_it(pages, notebook):
    page = pages[f"notebooks/{notebook.stem}.html"]
    cells = nbformat.read(notebook, as_version=4).cells
    outputs = [o for c in cells if c.cell_type == "code" for o in c.get("outputs", [])]
    widgets = sum("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    figures = sum("image/png" in o.get("data", {}) for o in outputs) + widgets  # a widget is shown as its picture
    figures += sum(len(re.findall(r"!\[[^]]*\]\([^)]+\.png\)", c.source)) for c in cells if c.cell_type == "markdown")
    drawn = [(src, width) for src, width in page["images"] if src.startswith("../_images/")]
    assert len(drawn) == figures and all(width > 0 for _, width in drawn)
    assert page["overflowing"] == []  # at the browser's 1400 x 1000, every figure fits the page
    assert "Run this lesson yourself" in page["text"] and "pytest -n 2" in page["text"]
    assert f"jupyter lab notebooks/{notebook.name}" in page["text"]
    assert not re.search(r"\bVBox\(|\bHBox\(|Output\(\)", page["text"]), "a widget shown as its repr"

"""What the browser tests share: a private JupyterLab 4 server, headless Debian Chromium through Playwright, Run All.

Importing this module skips the importing test module when Chromium or Playwright is missing (and fails it under
CI, which must install them). No network is used: Playwright drives the system Chromium, and JupyterLab is told
not to fetch news or check for updates.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("COMMHOOKS_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(os.environ.get("COMMHOOKS_SCREENSHOTS", ROOT / "tests" / "browser" / "screenshots"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
SETTINGS = {  # what a fresh JupyterLab would otherwise stop to ask, or fetch from the network
    # windowingMode "none": JupyterLab 4.6 renders (and so runs) cells lazily in its windowed mode, which left
    # the last cells of a long notebook unexecuted by Run All in a headless browser.
    # autoStartDefaultKernel: without it JupyterLab asked "Select Kernel" in CI for a notebook that names its kernel.
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {
        "autoStartDefaultKernel": True,
        "windowingMode": "none",
    },
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
}

if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):
        pytest.fail(f"CI must install Chromium ({CHROMIUM}): apt-get install -y chromium", pytrace=False)
    pytest.skip(
        f"no Chromium at {CHROMIUM} (apt-get install -y chromium, or set COMMHOOKS_CHROMIUM)", allow_module_level=True
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (no browser download needed)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, timeout_s: float, what: str, poll_s: float = 0.25):
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"{what} not ready after {timeout_s} s")


@dataclass
class JupyterLab:
    """A running server at ``base``, serving ``notebook`` (``url`` opens it); ``server`` is its process, ``log`` its
    output."""

    base: str
    token: str
    notebook: str
    server: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"{self.base}/lab/tree/{self.notebook}?token={self.token}"

    def kernel_ids(self) -> list[str] | None:
        """The ids of the server's running kernels (its REST API), or None while a kernel is half started.

        jupyter_server 2.21.1 answers ``GET /api/kernels`` with 500 in the moment between jupyter_client listing a
        new kernel and the server giving it ``last_activity`` (``kernel_model`` raises a TraitError that
        ``list_kernels`` does not catch). A loaded machine stretches that moment: the ``%%ddp`` browser test failed
        on it under four busy loops, its log showing the 500 just before "Kernel started".
        """
        try:
            with urllib.request.urlopen(f"{self.base}/api/kernels?token={self.token}", timeout=5) as r:
                return [k["id"] for k in json.load(r)]
        except urllib.error.HTTPError as exc:
            if exc.code == 500 and "last_activity" in self.log.read_text()[-20_000:]:
                return None
            raise

    def start_session(self) -> str:
        """Start the notebook's session and kernel (POST /api/sessions, as JupyterLab does); the kernel's id."""
        body = {"path": self.notebook, "name": self.notebook, "type": "notebook", "kernel": {"name": "python3"}}
        request = urllib.request.Request(
            f"{self.base}/api/sessions?token={self.token}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as r:
            return json.load(r)["kernel"]["id"]


@contextlib.contextmanager
def running_jupyterlab(tmp_path: Path, notebook: Path, name: str) -> Iterator[JupyterLab]:
    """A private JupyterLab on 127.0.0.1 with its own config, runtime, settings and workspaces, serving a copy
    of ``notebook`` as ``name``; stopped with SIGTERM on exit (the server shuts its kernels down first)."""
    dirs = {d: tmp_path / d for d in ("root", "config", "runtime", "settings", "workspaces")}
    for path in dirs.values():
        path.mkdir()
    for settings, values in SETTINGS.items():
        target = dirs["settings"] / settings
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    shutil.copy(notebook, dirs["root"] / name)
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        # `python -m jupyter lab` finds `jupyter-lab` on PATH: this interpreter's first, not an activated venv's
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "JUPYTER_CONFIG_DIR": str(dirs["config"]),
        "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
        "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]),
        "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"]),
    }
    log_path = tmp_path / "jupyterlab.log"
    log = open(log_path, "w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ip",
            "127.0.0.1",
            f"--port={port}",
            "--allow-root",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={dirs['root']}",
            f"--LabApp.user_settings_dir={dirs['settings']}",
            f"--LabApp.workspaces_dir={dirs['workspaces']}",
            "--ServerApp.open_browser=False",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )

    def status_ok():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2) as r:
                return r.status == 200
        except OSError:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited: {log_path.read_text()}")
            return False

    try:
        wait_until(status_ok, 60, "JupyterLab's server")
        yield JupyterLab(f"http://127.0.0.1:{port}", token, name, server, log_path)
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and every kernel it started
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(5)
        log.close()


@contextlib.contextmanager
def browser_page() -> Iterator:
    """A page of headless Chromium, 1400 x 1000; its console's errors and warnings are kept for :func:`diagnosis`."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            messages: list[str] = []
            page.on(
                "console", lambda m: messages.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None
            )
            page.on("pageerror", lambda e: messages.append(f"page error: {e}"))
            CONSOLE[id(page)] = messages
            try:
                yield page
            finally:
                CONSOLE.pop(id(page), None)
        finally:
            browser.close()


#: Each open page's console errors and warnings, by ``id(page)``.
CONSOLE: dict[int, list[str]] = {}


def diagnosis(page, lab: JupyterLab) -> str:
    """What a failed wait should report: the page's console errors, what its output areas show, the server's log."""
    outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
    return "\n".join(
        [
            "console errors and warnings (last 20):",
            *CONSOLE.get(id(page), [])[-20:],
            f"output areas ({len(outputs)}), first 300 characters of each:",
            *(f"  [{i}] {text[:300]!r}" for i, text in enumerate(outputs)),
            "JupyterLab's log (last 3000 characters):",
            lab.log.read_text()[-3000:],
        ]
    )


#: The notebook's kernel is connected and idle.
IDLE = ".jp-Notebook-ExecutionIndicator[data-status='idle']"
#: The execution count shown in code cell ``index``'s prompt: ``"1"``, ``"*"`` (queued or running) or ``""`` (not run).
PROMPT = """(index) => {
    const prompts = document.querySelectorAll('.jp-CodeCell .jp-InputPrompt');
    const match = index < prompts.length ? /\\[(\\d+|\\*)\\]/.exec(prompts[index].innerText) : null;
    return match ? match[1] : "";
}"""


def open_notebook(page, lab: JupyterLab) -> None:
    """Start the notebook's kernel through the server's REST API, then open the page, which joins that session.

    On a loaded machine a page that started the kernel itself once started it, shut it down and started another
    within 1.6 s (the server's log showed it), and the dashboard then rendered as its text (``VBox(...)``), as if the
    page's widget manager had stayed with the first kernel. Reloading the page once one kernel stayed fixed that,
    but a reload, under four busy loops, twice started a second kernel of its own. A page that finds its session
    already running starts no kernel, so it has nothing to race with; the check below holds it to that.
    """
    kernel_id = lab.start_session()
    page.goto(lab.url)
    page.wait_for_selector(IDLE, timeout=90_000)
    seen: list[list[str] | None] = []

    def the_kernel_for_two_seconds():
        seen.append(lab.kernel_ids())  # None (a kernel half started) is not [kernel_id], so the two seconds restart
        return len(seen) >= 8 and all(ids == [kernel_id] for ids in seen[-8:])

    wait_until(the_kernel_for_two_seconds, 60, f"the session's kernel {kernel_id} alone")


def accept_kernel_dialog(page) -> None:
    """Answer a "Select Kernel" dialog with its default (the notebook's own kernel), as a participant would: CI once
    showed one over a notebook whose kernel was already idle, and it blocks every click."""
    dialog = page.locator(".jp-Dialog:has-text('Select Kernel')")
    if dialog.count():
        dialog.locator("button.jp-mod-accept").click()
        dialog.wait_for(state="detached", timeout=10_000)


def run_all_cells(page, reaches: int = -1, attempts: int = 3, timeout_s: float = 180) -> None:
    """Run All once the kernel is idle, and wait until code cell ``reaches`` (default: the last) has run; retry
    when the kernel goes idle before that. A Run All sent while the session is still connecting walks through
    the cells without executing any of them; on a loaded machine JupyterLab once ran the first cell, replaced the
    kernel, and left the rest unrun (their prompts blank, the new kernel idle) while the first prompt said ``[1]``."""
    for attempt in range(attempts):
        page.wait_for_selector(IDLE, timeout=90_000)
        page.wait_for_selector(".jp-CodeCell .jp-InputPrompt", timeout=30_000)
        reaches %= page.locator(".jp-CodeCell").count()
        accept_kernel_dialog(page)
        page.click("li.lm-MenuBar-item:has-text('Run')")
        page.click("li.lm-Menu-item:has-text('Run All Cells')")
        idle_and_unrun = 0
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            prompt = page.evaluate(PROMPT, reaches)
            if prompt.isdigit():
                return
            stalled = prompt == "" and page.locator(IDLE).count() > 0
            idle_and_unrun = idle_and_unrun + 1 if stalled else 0
            if idle_and_unrun >= 8:  # two seconds idle with the cell still unrun: Run All did not reach it
                break
            time.sleep(0.25)
        if attempt == attempts - 1:
            raise AssertionError(f"Run All did not reach code cell {reaches} in {attempts} tries (prompt {prompt!r})")

"""The wheel carries the course: built, installed in a fresh environment (not editable), copied out, and run.

The fresh environment is a new venv whose own site-packages holds only the wheel; the project's
dependencies come from this venv's site-packages, added as a plain path (a ``.pth`` line), so its
``.pth`` files, the editable install's finder among them, never run there. What the notebook
imports as ``commhooks_lab`` is therefore the wheel's copy, which the test checks.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

from commhooks_lab.course import CATALOGUES, COURSE_FILES, copy_course, course_files, course_root

ROOT = Path(__file__).resolve().parents[2]
SDIST = "import sys, setuptools.build_meta as b; print(b.build_sdist(sys.argv[1]))"
#: The backend's own build_wheel, as ``python -m build --no-isolation`` calls it: the same 160 files, byte for byte,
#: as ``pip wheel --no-build-isolation`` made, without pip's second of start-up.
WHEEL = "import sys, setuptools.build_meta as b; print(b.build_wheel(sys.argv[1]))"


def _run(*args, cwd=None, **kwargs) -> subprocess.CompletedProcess:
    """Run a command outside the source tree by default: ``python -c`` there would import the clone's package."""
    cwd = cwd or Path(os.environ.get("TMPDIR", "/tmp"))
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=False, cwd=cwd, **kwargs)


def clean_tree(target: Path) -> Path:
    """The clone's files as a fresh clone has them (tracked, or new and not ignored), copied to ``target``.

    Built in the clone itself, the sdist would list every file of an old ``commhooks_lab.egg-info/SOURCES.txt``
    (setuptools reads it back), so a line lost from MANIFEST.in would go unseen wherever a build ran before."""
    listed = _run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():  # a file deleted but not yet committed is listed too
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory):
    """A venv with the wheel installed, and the python that runs in it.

    The wheel is built as ``python -m build`` would, from the sdist (so MANIFEST.in is tested too), and the sdist
    from the clone's files alone (:func:`clean_tree`), never from the clone, where an old ``build/`` folder can slip
    stale modules into the wheel and an old egg-info files into the sdist.
    """
    where = tmp_path_factory.mktemp("wheel")
    sdist = _run(sys.executable, "-c", SDIST, where, cwd=clean_tree(where / "clone"))
    assert sdist.returncode == 0, sdist.stderr[-2000:]
    with tarfile.open(where / sdist.stdout.split()[-1]) as archive:
        # the "data" filter refuses links out of the tree; tarfile has it from 3.11.4 (3.10.12), not on Debian's 3.11.2
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        archive.extractall(where / "sdist", **safe)
    (tree,) = (where / "sdist").iterdir()
    built = _run(sys.executable, "-c", WHEEL, where, cwd=tree)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = where.glob("commhooks_lab-*.whl")
    venv = where / "venv"
    assert _run(sys.executable, "-m", "venv", "--without-pip", venv).returncode == 0
    python = venv / "bin" / "python"
    purelib = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (purelib / "deps_from_the_test_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel)
    assert installed.returncode == 0, installed.stderr[-2000:]
    return python, purelib


def test_the_wheel_installs_the_course_and_copies_it_out(fresh_env, tmp_path):
    python, purelib = fresh_env
    where = _run(python, "-c", "import commhooks_lab.course as c; print(c.__file__); print(c.course_root())")
    assert where.returncode == 0, where.stderr[-2000:]  # a wheel without the course cannot name its root
    module, root = where.stdout.split()
    assert Path(module).is_relative_to(purelib), "the notebook would import the source tree, not the wheel"
    assert Path(root) == purelib / "commhooks_lab" / "course"
    copied = _run(python, "-m", "commhooks_lab", "notebooks", tmp_path / "course")
    assert copied.returncode == 0, copied.stderr
    assert sorted(
        p.relative_to(tmp_path / "course") for p in (tmp_path / "course").rglob("*.*") if p.name[0] != "."
    ) == (course_files(ROOT))
    assert f"{len(course_files(ROOT))} written" in copied.stdout
    recorded = sorted(p.name for p in (purelib / "commhooks_lab" / "studies" / "recorded").glob("*.json"))
    assert recorded == sorted(p.name for p in (ROOT / "commhooks_lab" / "studies" / "recorded").glob("*.json")), (
        "where links cannot be built, notebooks 8 and 12 replay these recordings: the wheel must carry them"
    )


def test_notebook_1_passes_its_regression_where_the_wheel_put_it(fresh_env, tmp_path):
    """In Korean (issue 52): the wheel carries the catalogues, and the translated notebook's code and outputs are
    the English ones, so it passes the same regression."""
    python, _ = fresh_env
    assert _run(python, "-m", "commhooks_lab", "notebooks", tmp_path, "--lang", "ko").returncode == 0
    notebook = tmp_path / "notebooks" / "01_quickstart.ipynb"
    english = json.loads((ROOT / "notebooks" / "01_quickstart.ipynb").read_text())
    korean = json.loads(notebook.read_text())
    assert [c for c in korean["cells"] if c["cell_type"] == "code"] == [
        c for c in english["cells"] if c["cell_type"] == "code"
    ]
    assert re.search("[가-힣]", "".join("".join(c["source"]) for c in korean["cells"] if c["cell_type"] == "markdown"))
    sanitize = (
        Path(
            _run(
                python, "-c", "import commhooks_lab, pathlib; print(pathlib.Path(commhooks_lab.__file__).parent)"
            ).stdout.strip()
        )
        / "nbval_sanitize.cfg"
    )
    env = {**os.environ, "PYTHONPATH": ""}
    result = _run(
        python,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "commhooks_lab.testing.plugin",
        "--nbval",
        "--nbval-current-env",
        "--nbval-sanitize-with",
        sanitize,
        notebook,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    print(result.stdout[-3000:])
    code_cells = sum(c["cell_type"] == "code" for c in json.loads(notebook.read_text())["cells"])
    assert re.search(rf"\b{code_cells} passed\b", result.stdout), result.stdout[-2000:]


def test_an_edited_notebook_is_kept_and_an_untouched_one_updated(tmp_path):
    first = copy_course(tmp_path)
    assert first.written and not first.kept
    texts = [name for name in first.written if name.suffix != ".png"]  # the course's pictures are not edited
    edited, untouched = tmp_path / texts[0], tmp_path / texts[1]
    edited.write_text(edited.read_text() + "\nmy own note\n")  # the learner's change
    manifest = json.loads((tmp_path / ".course.json").read_text())
    untouched.write_text("an older course's copy")  # as a previous version of the package left it
    manifest[str(texts[1])] = __import__("hashlib").sha256(untouched.read_bytes()).hexdigest()
    (tmp_path / ".course.json").write_text(json.dumps(manifest))

    again = copy_course(tmp_path)
    assert again.kept == [texts[0]] and again.written == [texts[1]]
    assert "edited by you and kept" in again.summary() and "--force" in again.summary()
    assert untouched.read_bytes() == (course_root() / texts[1]).read_bytes()
    assert edited.read_bytes() != (course_root() / texts[0]).read_bytes()

    forced = copy_course(tmp_path, force=True)
    assert forced.written == [texts[0]] and edited.read_bytes() == (course_root() / texts[0]).read_bytes()


def test_the_cli_says_which_files_it_kept_and_fails(tmp_path):
    from commhooks_lab.cli import main

    assert main(["notebooks", str(tmp_path)]) == 0
    (tmp_path / "notebooks" / "GLOSSARY.md").write_text("my notes")
    assert main(["notebooks", str(tmp_path)]) == 1
    assert (tmp_path / "notebooks" / "GLOSSARY.md").read_text() == "my notes"
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        main(["notebooks", str(tmp_path / "file")])


def test_every_link_inside_the_copied_course_resolves(tmp_path):
    copy_course(tmp_path)
    broken = []
    for name in (n for n in course_files(tmp_path) if n.suffix != ".png"):
        text = (tmp_path / name).read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not re.match(r"[a-z]+:", target) and not (tmp_path / name).parent.joinpath(target).exists():
                broken.append(f"{name} -> {target}")
    assert broken == []
    assert {p.split("/")[0] for p in COURSE_FILES} == {"notebooks", "docs"}


def test_the_build_step_copies_what_the_course_module_serves():
    """setup.py cannot import the package it builds, so it spells the course's patterns again: keep them equal."""
    import ast

    tree = ast.parse((ROOT / "setup.py").read_text())
    (copied,) = [
        ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "COURSE"
    ]
    assert copied == COURSE_FILES  # MANIFEST.in is tested by the wheel above: it is built from the sdist
    (catalogues,) = [
        ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "CATALOGUES"
    ]
    assert catalogues == CATALOGUES

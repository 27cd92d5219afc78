"""scripts/setup_venv.py: the lock it picks, and the one line it prints when pip cannot install.

pip's outputs in pip_outputs/ here were recorded on this machine (2026-12-07, progress bars removed), each with
the pip a fresh venv of that Python gets: the old single constraints.txt on Python 3.10.13 (pip 23.0.1) and on
Debian's 3.11.2 (pip 23.0.1), no network (``unshare -n``), an Intel Mac (``--platform macosx_10_13_x86_64``), and
a learner's copy of pyenv's 3.11.7 whose venv loaded Debian's libpython, so ssl failed to import.
"""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = Path(__file__).parent / "pip_outputs"
spec = importlib.util.spec_from_file_location("setup_venv", ROOT / "scripts" / "setup_venv.py")
setup_venv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup_venv)
paths = setup_venv.load_install_paths()
OLD_LOCK = setup_venv.read_lock(OUTPUTS / "old-constraints.txt")


def explain(recording: str, python: str, probe: dict, machine: str = "Linux x86_64") -> str:
    output = (OUTPUTS / recording).read_text()
    return setup_venv.explain(
        output, python=python, machine=machine, lock_file="constraints.txt", lock=OLD_LOCK, probe=probe
    )


def test_a_pin_for_a_newer_python_is_named_with_the_python_it_needs():
    # Debian 12's Python: pip's conflict names only soupsieve==4.1.3; the probe found it for 3.13, Requires >=3.11.5.
    line = explain("old-lock-3.11.2.txt", "3.11.2", {"python": "3.13", "requires_python": ">=3.11.5"})
    assert line.startswith("constraints.txt pins soupsieve==4.1.3, which pip finds for Python 3.13 but not for 3.11.2")
    assert "(it needs Python >=3.11.5)" in line and "\n" not in line


def test_a_pin_named_only_as_a_conflict_with_the_project_is_found():
    # Python 3.10: pip 23.0.1 names the project's numpy>=1.24 and "The user requested (constraint) numpy==2.4.6".
    assert setup_venv.unsatisfied_pin((OUTPUTS / "old-lock-3.10.13.txt").read_text(), OLD_LOCK) == "numpy==2.4.6"
    line = explain("old-lock-3.10.13.txt", "3.10.13", {"python": "3.13", "requires_python": ">=3.11"})
    assert "numpy==2.4.6" in line and "needs Python >=3.11" in line


def test_no_wheel_for_any_python_on_this_machine_says_where_the_lab_runs():
    line = explain("intel-mac-3.11.2.txt", "3.11.2", {}, machine="Darwin x86_64")
    assert line.startswith("constraints.txt pins torch==2.13.0, and pip finds no wheel of it")
    assert "Darwin x86_64" in line and "macOS 14+ on arm64" in line


def test_no_network_is_said_before_the_unsatisfied_requirement_it_causes():
    output = (OUTPUTS / "no-network-3.11.2.txt").read_text()
    assert "No matching distribution found for setuptools" in output  # what pip ends with
    line = explain("no-network-3.11.2.txt", "3.11.2", {})
    assert line.startswith("pip could not reach the package index") and "wheelhouse" in line


def test_a_python_without_ssl_is_named_not_pips_subprocess_error():
    output = (OUTPUTS / "no-ssl-3.11.7.txt").read_text()
    assert output.index("error: subprocess-exited-with-error") < output.index("ERROR: Could not find")
    line = explain("no-ssl-3.11.7.txt", "3.11.7", {})
    assert line.startswith("this Python cannot import its ssl module")


def test_any_other_failure_shows_pips_first_error_line():
    output = (
        "  error: subprocess-exited-with-error\nERROR: Could not install packages due to an OSError: [Errno 13] x\n"
    )
    line = setup_venv.explain(output, python="3.12.1", machine="Linux x86_64", lock_file="f", lock={}, probe={})
    assert line == "ERROR: Could not install packages due to an OSError: [Errno 13] x"


@pytest.mark.parametrize("version", [(3, 9, 18), (3, 14, 0), (2, 7, 18)])
def test_an_unsupported_python_is_refused_in_one_line(version):
    line = setup_venv.refusal(version, paths)
    assert line and "\n" not in line and "3.10-3.13" in line and ".".join(map(str, version)) in line


@pytest.mark.parametrize("version", paths.SUPPORTED_PYTHONS)
def test_every_supported_python_has_a_lock_with_the_same_torch(version):
    assert setup_venv.refusal((*version, 0), paths) is None
    lock = setup_venv.read_lock(ROOT / paths.lock_for(version))
    assert lock["torch"] == "torch==2.13.0"
    assert not re.search(r"(?m)^[^#\n]*(?:>=|<=|~=|!=)", (ROOT / paths.lock_for(version)).read_text())


def test_the_main_lock_moved_only_the_pins_debians_3_11_2_cannot_take():
    """The committed outputs were made with the old constraints.txt: every pin but soupsieve (Requires-Python
    >=3.11.5) is what it was."""
    main = setup_venv.read_lock(ROOT / paths.lock_for(paths.MAIN_PYTHON))
    moved = {name for name in OLD_LOCK if main.get(name) != OLD_LOCK[name]}
    assert moved == {"soupsieve"} and set(main) == set(OLD_LOCK)


def test_a_venv_of_another_python_is_not_reused(tmp_path, monkeypatch):
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.12.1\n")
    monkeypatch.setattr(setup_venv, "VENV", tmp_path)
    line = setup_venv.make_venv((3, 11, 2))
    assert line and "made by Python 3.12" in line and "rm -rf .venv" in line
    assert setup_venv.make_venv((3, 12, 4)) is None


def test_the_cpu_path_adds_pytorchs_index_and_pins_the_cpu_build_only(tmp_path):
    lock = setup_venv.read_lock(ROOT / paths.lock_for(paths.MAIN_PYTHON))
    args = setup_venv.cpu_only(lock, tmp_path, paths)
    assert args[:2] == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"] and args[2] == "-c"
    cpu_pin = Path(args[3]).read_text().strip()
    assert cpu_pin == "torch==2.13.0+cpu"
    # Why the second pin: the lock's pin alone admits PyPI's CUDA build; both together admit only the CPU build.
    admitted = [
        v for v in ("2.13.0", "2.13.0+cpu") if all(SpecifierSet(p[5:]).contains(v) for p in (lock["torch"], cpu_pin))
    ]
    assert SpecifierSet(lock["torch"][5:]).contains("2.13.0") and admitted == ["2.13.0+cpu"]


def older_python() -> Path | None:
    for version in ("3.9", "3.8", "3.7"):
        found = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python"))
        if found:
            return found[-1]
    return None


@pytest.mark.skipif(older_python() is None, reason="no Python 3.7-3.9 in ~/.pyenv to be refused")
def test_a_real_older_python_is_refused_in_one_line():
    done = subprocess.run([older_python(), ROOT / "scripts" / "setup_venv.py"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert re.fullmatch(r"setup_venv: Python 3\.[789]\.\d+ is not supported: .*\n", done.stderr)


def test_the_package_is_byte_compiled_even_where_python_writes_no_bytecode(tmp_path, monkeypatch):
    """An editable install compiles nothing, and under PYTHONDONTWRITEBYTECODE=1 an import never writes
    ``__pycache__``: setup_venv writes it once, so that later imports read it."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("X = 1\n")
    (package / "sub.py").write_text("Y = 2\n")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    subprocess.run([sys.executable, "-c", "import pkg.sub"], cwd=tmp_path, check=True)
    assert not (package / "__pycache__").exists()  # what every process would do: compile, and keep nothing
    assert setup_venv.byte_compile(Path(sys.executable), package)
    assert sorted(p.name.split(".")[0] for p in (package / "__pycache__").glob("*.pyc")) == ["__init__", "sub"]

"""Resolve constraints/py3.X.txt for another Python from the main lock, with that Python's own pip.

    python scripts/make_locks.py /path/to/python3.10 /path/to/python3.12 ...
    python scripts/make_locks.py --check PYTHON ...    # CI: each Python's lock still resolves, as it is

The main lock (constraints/py3.11.txt) holds the versions the committed notebook outputs were made with. For each
interpreter given, every main pin that can be installed there is kept; a pin whose Requires-Python excludes it, or
that has no wheel for it, is dropped, and so is one that conflicts with those changes: each such package takes
the version pip chooses freely on that Python (the newest it can). What pip's ``--dry-run --report`` then installs
is the new lock. For an interpreter of the main minor (Debian's 3.11.2 beside 3.11.7), only the dropped pins
change in the main lock, and no package is added.

Runs pip in a throwaway venv with a current pip, against PyPI only, as a learner's machine sees it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.specifiers import SpecifierSet

sys.path.insert(0, str(Path(__file__).resolve().parent))
import setup_venv  # noqa: E402

ROOT = setup_venv.ROOT
PATHS = setup_venv.load_install_paths()
MAIN = ROOT / PATHS.lock_for(PATHS.MAIN_PYTHON)
PYPI_ONLY = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
for variable in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_CONSTRAINT"):
    PYPI_ONLY.pop(variable, None)


# PyPI serves no PEP 658 metadata for torch's and most nvidia wheels: without HTTP range requests for each wheel's
# METADATA, a dry run downloads them whole (2.7 GB per Python; torch's wheel alone: 81 s, against 16 s lazily).
LAZY_WHEELS = ("--use-feature", "fast-deps")


def pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", *args], cwd=ROOT, env=PYPI_ONLY, capture_output=True, text=True)


def installable(python: Path, version: str, pins: dict[str, str]) -> dict[str, str]:
    """The pins this Python can take: each has a wheel for it and a Requires-Python that admits it."""
    pins = dict(pins)
    with tempfile.TemporaryDirectory() as folder:
        requirements = Path(folder) / "pins.txt"
        while True:
            requirements.write_text("\n".join(pins.values()) + "\n")
            done = pip(
                python, "install", *LAZY_WHEELS, "--dry-run", "--no-deps", "--ignore-requires-python",
                "--only-binary", ":all:", "--quiet", "--report", "-", "-r", str(requirements),
            )  # fmt: skip
            if done.returncode == 0:
                break
            missing = re.findall(r"No matching distribution found for ([\w.-]+)", done.stderr)
            if not missing:
                raise SystemExit(done.stderr)
            print(f"  no wheel for {version}: {pins[setup_venv.canonical(missing[0])]}")
            del pins[setup_venv.canonical(missing[0])]
    for item in json.loads(done.stdout)["install"]:
        needs = item["metadata"].get("requires_python")
        name = setup_venv.canonical(item["metadata"]["name"])
        if needs and version not in SpecifierSet(needs):
            print(f"  needs Python {needs}: {pins.pop(name)}")
    return pins


def attempt(python: Path, pins: dict[str, str]) -> tuple[dict[str, str] | None, str]:
    """One pip dry run of the project with these constraints: what it installs (``{name: name==version}``), or
    None and pip's output."""
    with tempfile.TemporaryDirectory() as folder:
        constraints, report = Path(folder) / "constraints.txt", Path(folder) / "report.json"
        constraints.write_text("\n".join(sorted(pins.values(), key=str.lower)) + "\n")
        done = pip(
            python, "install", *LAZY_WHEELS, "--dry-run", "--only-binary", ":all:", "--report", str(report),
            "-c", str(constraints), "-e", PATHS.EXTRAS,
        )  # fmt: skip
        if done.returncode:
            return None, done.stdout + done.stderr
        installed = json.loads(report.read_text())["install"]
    found = {setup_venv.canonical(i["metadata"]["name"]): f"{i['metadata']['name']}=={i['metadata']['version']}"
             for i in installed}  # fmt: skip
    found.pop("commhooks-lab", None)
    return found, ""


def resolve(python: Path, kept: dict[str, str], torch: str) -> dict[str, str]:
    """The project on this Python with as many kept pins as fit together.

    First pip chooses freely but for torch: a set that installs. Then every package is pinned, to its kept version
    where there is one, else to pip's free choice: with nothing left to choose, pip answers at once (no
    backtracking through old releases) and names the pins that conflict, which go back to the free choice."""
    fresh, output = attempt(python, {"torch": torch})
    if fresh is None:
        raise SystemExit(output)
    pins = {**fresh, **kept}
    while True:
        found, output = attempt(python, pins)
        if found is not None:
            return found
        back = [name for name in setup_venv.unsatisfied_names(output) if name in pins and pins[name] != fresh.get(name)]
        if not back:
            raise SystemExit(output)
        for name in back:
            print(f"  conflicts here: {pins[name]} -> {fresh.get(name, 'unpinned')}")
            if name in fresh:
                pins[name] = fresh[name]
            else:
                del pins[name]


def write(path: Path, pins: dict[str, str], version: str) -> None:
    if path == MAIN:
        header = [line for line in MAIN.read_text().splitlines() if line.startswith("#")]
    else:
        header = [
            f"# Python {version.rsplit('.', 1)[0]}: resolved on Python {version} by scripts/make_locks.py from "
            f"{MAIN.relative_to(ROOT)} (its pins kept",
            "# wherever this Python can install them). scripts/setup_venv.py picks this file for that Python.",
        ]
    path.write_text("\n".join(header + sorted(pins.values(), key=str.lower)) + "\n")


def throwaway_venv(interpreter: str, folder: str) -> tuple[Path, str]:
    """A venv of ``interpreter`` with a current pip, and that Python's version."""
    python = Path(folder) / "venv" / "bin" / "python"
    subprocess.run([interpreter, "-m", "venv", str(python.parents[1])], check=True)
    pip(python, "install", "--quiet", "--upgrade", "pip")
    version = subprocess.run([str(python), "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    return python, version


def lock_for_python(interpreter: str) -> None:
    main = setup_venv.read_lock(MAIN)
    with tempfile.TemporaryDirectory() as folder:
        python, version = throwaway_venv(interpreter, folder)
        print(f"Python {version}:")
        resolved = resolve(python, installable(python, version, main), main["torch"])
    minor = tuple(int(part) for part in version.split(".")[:2])
    target = ROOT / PATHS.lock_for(minor)
    if minor == PATHS.MAIN_PYTHON:
        moved = {name: resolved[name] for name in main if resolved.get(name, main[name]) != main[name]}
        print(f"  main lock: {sorted(moved.values())} moved for {version}")
        write(target, {**main, **moved}, version)
    else:
        write(target, resolved, version)
    print(f"  wrote {target.relative_to(ROOT)}: {len(resolved)} pins")


def check(interpreter: str) -> str | None:
    """pip's verdict on this Python's lock as it stands: None when it resolves, else setup_venv's one line."""
    with tempfile.TemporaryDirectory() as folder:
        python, version = throwaway_venv(interpreter, folder)
        minor = tuple(int(part) for part in version.split(".")[:2])
        lock_file = PATHS.lock_for(minor)
        done = pip(
            python, "install", *LAZY_WHEELS, "--dry-run", "-c", lock_file, "-e", PATHS.EXTRAS
        )  # no -q: it hides why
        if done.returncode == 0:
            print(f"Python {version}: {lock_file} resolves")
            return None
        lock, output = setup_venv.read_lock(ROOT / lock_file), done.stdout + done.stderr
        pin = setup_venv.unsatisfied_pin(output, lock)
        probe = setup_venv.probe_pin(python, minor, pin, [], PATHS) if pin else {}
    line = setup_venv.explain(output, python=version, machine="this machine", lock_file=lock_file, lock=lock,
                              probe=probe)  # fmt: skip
    return f"Python {version}: {line}"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--check"]:
        with ThreadPoolExecutor() as pool:  # network-bound: the Pythons side by side
            failures = [line for line in pool.map(check, sys.argv[2:]) if line]
        print(*failures, sep="\n", file=sys.stderr)
        sys.exit(1 if failures else 0)
    for interpreter in sys.argv[1:]:
        lock_for_python(interpreter)

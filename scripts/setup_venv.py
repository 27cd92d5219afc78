#!/usr/bin/env python3
"""Make ``.venv`` with the exact versions for the Python that runs this script, and say in one line why not.

    python3 scripts/setup_venv.py          # torch from PyPI: on Linux, the CUDA build
    python3 scripts/setup_venv.py --cpu    # torch's CPU build, from PyTorch's CPU index

A script, not one pip command: each Python minor needs its own lock (``constraints/py3.X.txt``), and when pip
cannot install, the cause sits in the middle of its output (``-q`` hides it). pip's whole output goes to
``.venv/pip-install.log``; on failure this script reads it and prints the cause and what to do.

Standard library only, and it runs on any Python 3.7+ so that an unsupported one is refused in words.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
LOG = VENV / "pip-install.log"

# Signs in pip's output that it never reached an index; each is a urllib3/socket error pip prints while retrying.
NO_NETWORK = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Connection refused",
    "ConnectTimeoutError",
    "Read timed out",
    "ProxyError",
)


def load_install_paths():
    """commhooks_lab/course/install_paths.py by path: the package itself (and torch) is not installed yet."""
    spec = importlib.util.spec_from_file_location(
        "install_paths", ROOT / "commhooks_lab" / "course" / "install_paths.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refusal(version: tuple, paths) -> str | None:
    """One line for a Python the lab does not support, or None."""
    if paths.supported(version):
        return None
    running = ".".join(map(str, version[:3]))
    return (
        f"Python {running} is not supported: commhooks_lab needs Python {paths.supported_range()}. "
        f"Run this script with one of those, e.g. python3.12 scripts/setup_venv.py"
    )


def unsatisfied_names(output: str) -> list[str]:
    """The pinned packages pip names in its conflict report or its "No matching distribution" line, canonical."""
    named = re.findall(r"The user requested \(constraint\) ([\w.-]+)==", output)
    named += re.findall(r"No matching distribution found for ([\w.-]+)", output)
    return [canonical(name) for name in named]


def unsatisfied_pin(output: str, lock: dict[str, str]) -> str | None:
    """The lock's pin that pip could not satisfy (``name==version``); None when pip failed on something else."""
    return next((lock[name] for name in unsatisfied_names(output) if name in lock), None)


def explain(output: str, *, python: str, machine: str, lock_file: str, lock: dict[str, str], probe: dict) -> str:
    """The one line a learner reads when pip failed: the cause in pip's output and what to do.

    ``probe`` is what ``probe_pin`` found for the pin pip could not satisfy: the other Python that has it and the
    Pythons it admits, or {} when no supported Python has a wheel of it on this machine.
    """
    if any(sign in output for sign in NO_NETWORK):
        host = re.search(r"host='([^']+)'", output) or re.search(r"https?://([^/\s:]+)", output)
        where = f" ({host.group(1)})" if host else ""
        return (
            f"pip could not reach the package index{where}: connect this machine to the network (behind a proxy, "
            f"set HTTPS_PROXY), or install offline from a wheelhouse (docs/teaching.md)"
        )
    if "the ssl module in Python is not available" in output:
        return (
            "this Python cannot import its ssl module, so pip cannot reach an HTTPS index: use a Python that "
            "can (Debian/Ubuntu: apt install python3; pyenv: install libssl-dev, then pyenv install again)"
        )
    if "CERTIFICATE_VERIFY_FAILED" in output:
        return (
            "pip could not verify the index's certificate (a proxy that inspects HTTPS?): point pip at your "
            "organisation's CA bundle with PIP_CERT=/path/to/ca.pem, then run this again"
        )
    if "No space left on device" in output:
        return (
            "the disk is full: the default torch (a CUDA build) needs about 7 GB free for .venv and pip's cache; "
            "free some space, or use the CPU build: python3 scripts/setup_venv.py --cpu (about 2 GB)"
        )
    pin = unsatisfied_pin(output, lock)
    if pin and probe:
        return (
            f"{lock_file} pins {pin}, which pip finds for Python {probe['python']} but not for {python} "
            f"(it needs Python {probe['requires_python']}): run this script with Python {probe['python']}; "
            f"the lock is wrong for {python}, please report it"
        )
    if pin:
        return (
            f"{lock_file} pins {pin}, and pip finds no wheel of it for any supported Python on {machine}: "
            f"torch {lock['torch'].split('==')[1]} has wheels for Linux (x86-64, aarch64), macOS 14+ on arm64 and "
            f"Windows x86-64; run the lab on one of those"
        )
    lines = [line.strip() for line in output.splitlines()]
    errors = [line for line in lines if line.startswith("ERROR:")] or [
        line for line in lines if line.startswith("error:")
    ]
    return errors[0] if errors else "pip failed without an ERROR line"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """``{canonical name: "name==version"}`` for every pin in a constraints file."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            pins[canonical(line.split("==", 1)[0])] = line
    return pins


def probe_pin(python: Path, running: tuple, pin: str, extra: list[str], paths) -> dict:
    """Ask pip for ``pin`` alone as each other supported Python would get it, newest first: the first that finds
    a wheel shows the pin exists, just not for this Python, and pip's report says which Pythons it admits."""
    for minor in [f"{v[0]}.{v[1]}" for v in reversed(paths.SUPPORTED_PYTHONS) if v != tuple(running[:2])]:
        with tempfile.TemporaryDirectory() as target:
            command = [str(python), "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-requires-python"]
            command += ["--only-binary", ":all:", "--python-version", minor, "--target", target]
            done = subprocess.run([*command, "--quiet", "--report", "-", *extra, pin], capture_output=True, text=True)
        if done.returncode == 0:
            metadata = (json.loads(done.stdout).get("install") or [{}])[0].get("metadata", {})
            return {"python": minor, "requires_python": metadata.get("requires_python") or "any"}
    return {}


def make_venv(version: tuple) -> str | None:
    """Create .venv with pip, or reuse one made by this Python's minor; a line saying why not otherwise."""
    config = VENV / "pyvenv.cfg"
    if config.exists():
        made = re.search(r"^version(?:_info)?\s*=\s*(\d+)\.(\d+)", config.read_text(), flags=re.M)
        if made and (int(made.group(1)), int(made.group(2))) != tuple(version[:2]):
            return (
                f".venv was made by Python {made.group(1)}.{made.group(2)}, this is {version[0]}.{version[1]}: "
                f"remove it (rm -rf .venv) or run this script with that Python"
            )
        return None
    try:
        venv.EnvBuilder(with_pip=True).create(VENV)
    except (subprocess.CalledProcessError, OSError) as exc:
        return (
            f"Python could not make a venv with pip ({exc}): on Debian or Ubuntu, "
            f"sudo apt install python{version[0]}.{version[1]}-venv, then run this again"
        )
    return None


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def byte_compile(python: Path, package: Path) -> bool:
    """Write the package's bytecode (``__pycache__``) once, as pip does for every package it installs but not for
    an editable one. Where ``PYTHONDONTWRITEBYTECODE`` is set (containers and hosted notebooks often set it),
    Python never writes it, so every process that imports the lab would compile its modules again: about 0.8
    CPU-seconds each, in every kernel, rank server and command. A failure costs only that time."""
    done = subprocess.run([str(python), "-m", "compileall", "-q", str(package)], capture_output=True, check=False)
    return done.returncode == 0


def cpu_only(lock: dict[str, str], folder: Path, paths) -> list[str]:
    """pip's extra arguments for torch's CPU build: PyTorch's CPU index beside the usual one, and a second pin.

    The lock's torch==X matches X+cpu too (PEP 440 ignores a local label the pin lacks); the second pin makes the
    CPU build the only one pip may take, so a missing CPU wheel is an error, not a silent CUDA build."""
    pin = folder / "cpu-torch.txt"
    pin.write_text(lock["torch"] + "+cpu\n")
    return ["--extra-index-url", paths.CPU_INDEX, "-c", str(pin)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="torch's CPU build, from PyTorch's CPU wheel index")
    args = parser.parse_args(argv)
    paths = load_install_paths()
    version = tuple(sys.version_info[:3])
    say = refusal(version, paths)
    if say:
        print(f"setup_venv: {say}", file=sys.stderr)
        return 2
    say = make_venv(version)
    if say:
        print(f"setup_venv: {say}", file=sys.stderr)
        return 1
    lock_file = paths.lock_for(version)
    lock = read_lock(ROOT / lock_file)
    extra = cpu_only(lock, VENV, paths) if args.cpu else []
    command = [str(venv_python()), "-m", "pip", "install", "-c", lock_file, *extra, "-e", paths.EXTRAS]
    source = "PyTorch's CPU index" if args.cpu else "pip's index (PyPI: the CUDA build on Linux)"
    print(f"setup_venv: Python {platform.python_version()}, {lock_file}, {lock['torch']} from {source}; log: {LOG}")
    start = time.monotonic()
    with LOG.open("w") as log:
        done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode == 0:
        byte_compile(venv_python(), ROOT / "commhooks_lab")
        print(f"setup_venv: installed in {time.monotonic() - start:.0f} s")
        return 0
    output = LOG.read_text()
    pin = unsatisfied_pin(output, lock)
    probe = probe_pin(venv_python(), version, pin, extra, paths) if pin else {}
    line = explain(
        output,
        python=platform.python_version(),
        machine=f"{platform.system()} {platform.machine()}",
        lock_file=lock_file,
        lock=lock,
        probe=probe,
    )
    print(f"setup_venv: {line} (pip's output: {LOG})", file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())

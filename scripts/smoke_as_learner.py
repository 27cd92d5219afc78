"""CI smoke run: the README's two commands as an ordinary account, from a fresh clone in its 0700 home.

    .venv/bin/python scripts/smoke_as_learner.py [--account learner] [--python-dir DIR] [TEST ...]

Run as root, from a clone anywhere. Every other check runs as root; learners do not. The account (made with
``useradd -m`` if absent, and removed again) clones this checkout's HEAD into a new folder of its home, which is
0700 for the run, and runs README command 1 as written there, then README command 2 on a small subset: the
launcher's units, two-rank Clusters, portable numerics, notebook 1 under nbval and one folder of the challenge
scored in its sandbox (``TEST ...`` replaces it).
Both commands are read from the README's ``<!-- command: ... -->`` blocks, never copied here.

Command 1 installs everything from scratch (258 s on this busy 2-core machine: unpacking and byte-compiling
~61,000 files, mostly torch). No download is saved because none happens: the account's pip gets this machine's pip
configuration (the wheels on this disk, the CPU build of torch among them), the sources root's own install of
command 1 used. A new account's pip without it would fetch PyPI's CUDA build of torch (about 3 GB): another
check's concern.

``python3`` is the account's own: Debian's, unless ``--python-dir`` puts another first on its PATH. Everything
it made (the clone, its venv, the pip cache, the XDG folders its runs fill) goes at the end; the account goes
only if this script made it.
"""

from __future__ import annotations

import argparse
import ast
import os
import pwd
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _smoke import Steps, require_root
from build_site import readme_commands

ROOT = Path(__file__).resolve().parents[1]
SUBSET = (
    "tests/unit/test_launcher_units.py",
    "tests/multiprocess/test_cluster.py",
    "tests/multiprocess/test_numerics.py",
    "notebooks/01_quickstart.ipynb",
    # the challenge's sandbox: a user namespace of the account's own, where root's folders read as nobody's
    "tests/multiprocess/test_challenge_sandbox.py::test_the_same_folder_gives_the_same_page_and_a_learner_their_own_score",
)


def machine_pip_config(folder: Path) -> dict[str, str]:
    """Root's pip configuration as the account's: a config file of its files' settings, and its PIP_* variables."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    sections: dict[str, list[str]] = {}
    for line in listed.stdout.splitlines():
        key, _, value = line.partition("=")
        section, _, option = key.partition(".")
        if section != ":env:" and option:  # the environment's own settings pass below, as variables
            sections.setdefault(section, []).append(f"{option} = {ast.literal_eval(value)}")
    config = folder / "pip.conf"
    config.write_text("".join(f"[{name}]\n" + "\n".join(lines) + "\n" for name, lines in sections.items()))
    config.chmod(0o644)
    variables = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    return {**variables, "PIP_CONFIG_FILE": str(config), "PIP_CACHE_DIR": str(folder / "pip-cache")}


def account(name: str) -> tuple[pwd.struct_passwd, bool]:
    """The account and whether this script made it."""
    try:
        return pwd.getpwnam(name), False
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
        return pwd.getpwnam(name), True


def processes_of(user: pwd.struct_passwd, folder: Path) -> dict[int, str]:
    """The account's processes that run from ``folder``: pid -> command."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == user.pw_uid:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if str(folder) in command:
                    found[int(entry.name)] = command
        except OSError:
            pass
    return found


def end_processes_of(user: pwd.struct_passwd, folder: Path, grace_s: float = 10.0) -> list[str]:
    """SIGKILL the account's processes that still run from ``folder`` after ``grace_s`` (this run's, left behind);
    their commands. The grace: a forkserver whose pytest worker has exited ends when it reads the closed pipe, a
    second or two later, and is not left behind."""
    deadline = time.monotonic() + grace_s
    while processes_of(user, folder) and time.monotonic() < deadline:
        time.sleep(0.2)
    ended = []
    for pid, command in processes_of(user, folder).items():
        try:
            os.kill(pid, signal.SIGKILL)
            ended.append(f"{pid}: {command[:200]}")
        except OSError:
            pass
    return ended


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--account", default="learner")
    parser.add_argument("--python-dir", help="a folder put first on the account's PATH (its python3 runs command 1)")
    parser.add_argument("tests", nargs="*", default=list(SUBSET), help="what command 2 runs (default: the subset)")
    args = parser.parse_args()
    require_root("smoke_as_learner")
    if subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD"]).returncode:
        print("note: this checkout has uncommitted changes; the account's clone has HEAD only", flush=True)
    commands = readme_commands()
    user, made = account(args.account)
    home = Path(user.pw_dir)
    home_mode = stat.S_IMODE(home.stat().st_mode)
    home.chmod(0o700)
    work = Path(tempfile.mkdtemp(prefix="commhooks-smoke-", dir=home))
    clone = work / "commhooks_lab"
    steps = Steps(f"README commands as {user.pw_name} (uid {user.pw_uid}) in {work}, home 0700")
    try:
        subprocess.run(
            ["git", "-C", str(ROOT), "bundle", "create", "-q", str(work / "head.bundle"), "HEAD"], check=True
        )
        path = "/usr/local/bin:/usr/bin:/bin"
        env = {
            "HOME": str(home),
            "USER": user.pw_name,
            "LOGNAME": user.pw_name,
            "LANG": "C.UTF-8",
            "PATH": f"{args.python_dir}:{path}" if args.python_dir else path,
            # what a run keeps per account (matplotlib's font cache, Jupyter's and IPython's files) goes with the run
            **{f"XDG_{kind}_HOME": str(work / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA", "STATE")},
            "IPYTHONDIR": str(work / "ipython"),
            **machine_pip_config(work),
        }
        for item in work.iterdir():
            os.chown(item, user.pw_uid, user.pw_gid)
        os.chown(work, user.pw_uid, user.pw_gid)

        def as_account(label: str, command: str, where: Path) -> int:
            argv = ["runuser", "-u", user.pw_name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]
            argv += ["bash", "-c", f"cd {shlex.quote(str(where))} && {command}"]
            return steps.run(label, argv, shown=f"(as {user.pw_name}, in {where}) {command}")

        clone_it = f"git -c advice.detachedHead=false clone -q head.bundle {clone.name}"
        if as_account("fresh clone", clone_it, work) == 0:
            as_account("python3", "command -v python3 && python3 --version", clone)
            if as_account("README command 1", commands["setup"], clone) == 0:
                as_account(
                    f"README command 2 on {len(args.tests)} paths",
                    f"{commands['test']} {shlex.join(args.tests)}",
                    clone,
                )
    finally:
        start = time.monotonic()
        for ended in end_processes_of(user, work):
            print(f"ended a process the run left behind: {ended}", flush=True)
        shutil.rmtree(work, ignore_errors=True)
        if made:
            subprocess.run(["userdel", "-r", user.pw_name], check=False)
        else:
            home.chmod(home_mode)
        print(f"\nremoved {work}{' and the account' if made else ''} in {time.monotonic() - start:.0f} s", flush=True)
    return steps.exit_code()


if __name__ == "__main__":
    sys.exit(main())

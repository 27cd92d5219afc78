"""Issue 48: a course folder handed around (a USB stick, a tar) cannot make ``notebooks DIR`` write outside it,
block, or leave half a notebook; every refusal names the file. Each test failed on the code before the fix."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commhooks_lab.course import copy_course, course_files, course_root

NOTEBOOK = Path("notebooks/08_when_compression_pays_off.ipynb")
#: Long enough for a command that imports the package; far below the minute a blocked read waited on main.
QUICK_S = 30


def _tree(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder`` (links as their targets, files as their bytes): what changed, exactly."""
    found: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            found[key] = "-> " + os.readlink(path)
        elif path.is_file():
            found[key] = path.read_bytes()
        else:
            found[key] = "dir" if path.is_dir() else "special"
    return found


def _notebooks(folder, *extra, timeout=QUICK_S, **kwargs) -> subprocess.CompletedProcess:
    """The command as a learner runs it, in a process of its own: a read that blocks fails the test, not the run."""
    return subprocess.run(
        [sys.executable, "-m", "commhooks_lab", "notebooks", str(folder), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


@pytest.fixture
def outside(tmp_path):
    """A victim file and folder beside the course folder, and the course folder itself (empty)."""
    (tmp_path / "victim.txt").write_text("precious\n")
    (tmp_path / "victimdir").mkdir()
    (tmp_path / "c1").mkdir()
    return tmp_path


def _plant(course: Path, name: str, target: str) -> None:
    (course / name).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, course / name)


@pytest.mark.parametrize(
    "name, target, forged, force",
    [
        (".course.json", "../victim.txt", False, False),
        (str(NOTEBOOK), "../../victim.txt", True, False),  # .course.json claims the victim's sha256
        (str(NOTEBOOK), "../../victim.txt", False, True),  # --force
        ("notebooks/GLOSSARY.md", "../../planted/evil_created.py", False, False),  # dangling
        ("docs", "../victimdir", False, False),  # a folder
    ],
)
def test_a_link_in_the_course_folder_is_refused_by_name_and_nothing_outside_changes(
    outside, name, target, forged, force
):
    course = outside / "c1"
    _plant(course, name, target)
    if forged:
        (course / ".course.json").write_text(json.dumps({name: hashlib.sha256(b"precious\n").hexdigest()}))
    before = _tree(outside)
    with pytest.raises(ValueError, match=f"{name}.*symbolic link.*rm "):
        copy_course(course, force=force)
    assert _tree(outside) == before  # nothing outside, and nothing inside either: refused before any write
    assert not (outside / "planted").exists()


def test_a_fifo_or_a_device_in_the_course_folder_is_refused_in_under_a_second(outside):
    course = outside / "c1"
    (course / "notebooks").mkdir()
    os.mkfifo(course / ".course.json")
    os.mkfifo(course / NOTEBOOK)
    os.symlink("/dev/zero", course / "notebooks" / "GLOSSARY.md")
    started = time.monotonic()
    with pytest.raises(ValueError) as refused:
        copy_course(course)
    assert time.monotonic() - started < 1
    assert ".course.json is a FIFO (named pipe)" in str(refused.value)
    os.unlink(course / ".course.json")
    with pytest.raises(ValueError) as refused:
        copy_course(course)
    assert f"{NOTEBOOK} is a FIFO" in str(refused.value) and "GLOSSARY.md is a symbolic link" in str(refused.value)


def test_the_command_on_a_fifo_answers_instead_of_blocking(outside):
    """On main this waited for a writer forever (here: until the timeout)."""
    os.mkfifo(outside / "c1" / ".course.json")
    started = time.monotonic()
    done = _notebooks(outside / "c1")
    assert done.returncode == 2 and "FIFO" in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < QUICK_S


def _limit_memory():  # on main /dev/zero was read until memory ran out: keep that from the machine
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


@pytest.mark.parametrize("content", ["/dev/zero", "[" * 100_000, "x" * 10])
def test_a_damaged_record_gives_a_message_not_a_traceback(outside, content):
    course = outside / "c1"
    if content.startswith("/dev/"):
        os.symlink(content, course / ".course.json")
    else:
        (course / ".course.json").write_text(content)
    done = _notebooks(course, preexec_fn=_limit_memory)
    assert "Traceback" not in done.stderr, done.stderr[-600:]
    if content.startswith("/dev/"):
        assert done.returncode == 2 and ".course.json is a symbolic link" in done.stderr
    else:  # a damaged record: every file is new here, so all are written, with a note
        assert done.returncode == 0 and "note:" in done.stdout and (course / NOTEBOOK).exists()


def test_an_empty_folder_name_is_refused(tmp_path):
    """``notebooks "$DIR"`` with DIR unset copied 25 files into the current folder."""
    done = _notebooks("", cwd=tmp_path)
    assert done.returncode == 2 and "unset variable" in done.stderr
    assert list(tmp_path.iterdir()) == []


def _no_bigger_files(limit: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_copy_that_runs_out_of_room_leaves_no_half_notebook(tmp_path):
    """A file-size limit below notebook 8's size stops the copy part way, as a full disk does."""
    size = (course_root() / NOTEBOOK).stat().st_size
    course = tmp_path / "c1"
    failed = _notebooks(course, preexec_fn=_no_bigger_files(size // 2))
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr[-600:]
    assert "nothing there was changed" in failed.stderr
    assert [p for p in course.rglob("*")] == []  # no half notebook, no hidden leftovers, no new folders
    again = _notebooks(course)
    assert again.returncode == 0 and f"{len(course_files())} written" in again.stdout
    assert (course / NOTEBOOK).read_bytes() == (course_root() / NOTEBOOK).read_bytes()


def test_a_notebook_cut_short_by_an_older_copy_is_replaced_not_kept_as_an_edit(tmp_path):
    """What main left on a full disk: a notebook cut short and no .course.json. It then said "1 edited by you"."""
    copy_course(tmp_path)
    whole = (tmp_path / NOTEBOOK).read_bytes()
    (tmp_path / NOTEBOOK).write_bytes(whole[: len(whole) // 2])
    (tmp_path / ".course.json").unlink()
    again = copy_course(tmp_path)
    assert again.kept == [] and again.repaired == [NOTEBOOK] and (tmp_path / NOTEBOOK).read_bytes() == whole


def _mount_tmpfs(where: Path, options: str) -> bool:
    if os.geteuid() != 0:
        return False
    where.mkdir(exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)]
    return subprocess.run(mount, capture_output=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs, as issue 48 measured it (root only; skipped elsewhere: the file-size test covers them)."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "size=2m"):
        pytest.skip("mounting a tmpfs needs root")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_on_a_full_disk_the_folder_is_left_as_it_was(small_disk):
    (small_disk / "mine.txt").write_text("a learner's file\n")
    done = _notebooks(small_disk / "course")
    assert done.returncode == 2 and "the disk is full" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in small_disk.rglob("*")) == ["mine.txt"]


@pytest.fixture
def read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    if os.geteuid() == 0:
        if not _mount_tmpfs(folder, "size=1m,ro"):
            pytest.skip("root writes into any folder, and no read-only tmpfs could be mounted")
        yield folder
        subprocess.run(["umount", str(folder)], check=True)
    else:
        folder.mkdir()
        folder.chmod(0o500)
        yield folder
        folder.chmod(0o700)


def test_a_read_only_folder_gives_a_message_not_a_traceback(read_only_folder):
    done = _notebooks(read_only_folder)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-600:]
    assert str(read_only_folder) in done.stderr and "give a folder you can write to" in done.stderr

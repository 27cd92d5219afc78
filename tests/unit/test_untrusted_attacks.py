"""Issue 48's own attack on the new code, beyond the list it was filed with: hard links, a folder swapped for a
link between the look and the write, a FIFO swapped in between lstat and open, names that would forge a message,
sparse files, and links where ``compare --out`` writes."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path

import pandas as pd
import pytest

import commhooks_lab as lab
from commhooks_lab import cli
from commhooks_lab.course import copy as course_copy
from commhooks_lab.course import copy_course
from commhooks_lab.safe_files import Folder, UnsafeFileError

NOTEBOOK = "notebooks/08_when_compression_pays_off.ipynb"


def _result() -> lab.Result:
    steps = pd.DataFrame({"step": [0], "loss": [1.0], "payload_bytes": [1], "compressing": [True]})
    return lab.Result({"hook": "fp16"}, steps, pd.DataFrame({"step": [0]}), [], {}, {"param_digests": ["a"]})


@pytest.fixture
def victim(tmp_path):
    (tmp_path / "victim.txt").write_text("precious\n")
    (tmp_path / "victimdir").mkdir()
    yield tmp_path
    assert (tmp_path / "victim.txt").read_text() == "precious\n"
    assert list((tmp_path / "victimdir").iterdir()) == []


def test_a_hard_link_to_an_outside_file_is_replaced_not_written_through(victim):
    course = victim / "c"
    (course / "notebooks").mkdir(parents=True)
    os.link(victim / "victim.txt", course / NOTEBOOK)
    (course / ".course.json").write_text(json.dumps({NOTEBOOK: hashlib.sha256(b"precious\n").hexdigest()}))
    assert Path(NOTEBOOK) in copy_course(course).written
    assert os.stat(victim / "victim.txt").st_nlink == 1  # the course's entry was renamed over, the victim untouched


def test_a_folder_swapped_for_a_link_after_the_look_still_gets_the_files(victim, monkeypatch):
    """The folders are held open by descriptor from the first look: a swap afterwards cannot redirect a write."""
    course = victim / "c"
    copy_course(course)
    (course / NOTEBOOK).write_bytes(b"{}")
    record = json.loads((course / ".course.json").read_text())
    (course / ".course.json").write_text(json.dumps({**record, NOTEBOOK: hashlib.sha256(b"{}").hexdigest()}))
    write = course_copy._write

    def swapped(tree, writes, done):
        os.rename(course / "notebooks", course / "moved")
        os.symlink("../victimdir", course / "notebooks")
        return write(tree, writes, done)

    monkeypatch.setattr(course_copy, "_write", swapped)
    copy_course(course)
    assert (course / "moved" / NOTEBOOK.split("/")[1]).stat().st_size > 2


def test_a_fifo_swapped_in_between_the_look_and_the_open_is_refused(tmp_path, monkeypatch):
    _result().save(tmp_path / "a.json")
    look = Folder.mode

    def swap_after_looking(self, name):
        mode = look(self, name)
        if name == "a.json" and stat.S_ISREG(mode):
            os.unlink(self.path / name)
            os.mkfifo(self.path / name)
        return mode

    monkeypatch.setattr(Folder, "mode", swap_after_looking)
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"a\.json is a FIFO"):
        lab.load(tmp_path)
    assert time.monotonic() - started < 1


def test_a_name_cannot_forge_a_line_of_the_message(tmp_path):
    os.mkfifo(tmp_path / "x\nrank 0 is fine.json")
    with pytest.raises(ValueError) as refused:
        lab.load(tmp_path)
    assert "\n" not in str(refused.value) and r"x\nrank 0 is fine.json" in str(refused.value)


@pytest.mark.parametrize("name", ["..", "../victim.txt", "a/b", "", "x\0y"])
def test_a_name_that_leaves_the_folder_is_refused(tmp_path, name):
    with Folder.open(tmp_path, "advice") as folder, pytest.raises(UnsafeFileError, match="is not a name inside"):
        folder.read(name, 100)


def test_a_sparse_file_is_refused_by_its_size_before_a_byte_is_read(tmp_path):
    with open(tmp_path / "big.json", "wb") as f:
        f.truncate(100 << 30)
    with pytest.raises(ValueError, match=r"big\.json is 107,374,182,400 bytes"):
        lab.load(tmp_path)


def test_a_255_character_name_is_saved_whole_and_leaves_nothing_hidden(tmp_path):
    _result().save(tmp_path / ("r" * 250 + ".json"))
    assert len(lab.load(tmp_path)) == 1 and [n for n in os.listdir(tmp_path) if n.startswith(".")] == []


def test_a_damaged_record_says_what_happened_without_a_placeholder(tmp_path):
    (tmp_path / ".course.json").write_text("not json")
    notes = copy_course(tmp_path).notes
    assert len(notes) == 1 and "{path}" not in notes[0] and ".course.json is damaged" in notes[0]


@pytest.mark.parametrize("name", cli.OUT_NAMES)
def test_compare_refuses_a_link_where_it_writes_inside_out(victim, name):
    out = victim / "run"
    out.mkdir()
    os.symlink("../victimdir" if name == "results" else "../victim.txt", out / name)
    with pytest.raises(ValueError, match=f"{name} is a link or not a file"):
        cli._check_out(out)


def test_a_device_node_itself_in_the_folders_is_refused_without_being_opened(tmp_path):
    """A device node (not a link to one), as a tar extracted by root can hold: never opened, refused by name."""
    try:
        os.mknod(tmp_path / "01_bf16.json", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers
    except OSError:
        pytest.skip("making a device node needs root (and a container that allows it)")
    (tmp_path / "notebooks").mkdir()
    os.mknod(tmp_path / NOTEBOOK, stat.S_IFCHR | 0o600, os.makedev(1, 5))
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"01_bf16\.json is a character device"):
        lab.load(tmp_path)
    with pytest.raises(ValueError, match=f"{NOTEBOOK} is a character device"):
        copy_course(tmp_path)
    assert time.monotonic() - started < 1

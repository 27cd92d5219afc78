"""The learner smoke ends only what a run really left behind: a process that exits on its own within the grace
(a forkserver reading its closed pipe) is not reported; one that keeps running is ended and named."""

import os
import pwd
import subprocess
import sys
import time

from conftest import load_script

smoke = load_script("smoke_as_learner")


def seen(user, folder, pid):
    """Wait until /proc shows ``pid`` with its command line (just after exec it may not yet)."""
    deadline = time.monotonic() + 5
    while pid not in smoke.processes_of(user, folder):
        assert time.monotonic() < deadline, f"{pid} never showed up in /proc"
        time.sleep(0.01)


def test_a_process_that_ends_within_the_grace_is_not_left_behind_and_one_that_runs_on_is_ended(tmp_path):
    me = pwd.getpwuid(os.getuid())
    marker = str(tmp_path / "run-folder")
    code = "import sys, time; time.sleep(float(sys.argv[1]))"
    ending = subprocess.Popen([sys.executable, "-c", code, "1", marker])
    seen(me, tmp_path, ending.pid)
    assert smoke.end_processes_of(me, tmp_path, grace_s=10) == []
    assert ending.wait(timeout=5) == 0  # it ended by itself

    argv = [sys.executable, "-c", code, "600", marker]
    staying = subprocess.Popen(argv)
    seen(me, tmp_path, staying.pid)
    start = time.monotonic()
    ended = smoke.end_processes_of(me, tmp_path, grace_s=0.5)
    assert staying.wait(timeout=5) == -9 and time.monotonic() - start < 5
    # the command as /proc gives it (NULs as spaces), cut at 200 characters: in a learner's home the venv's path
    # alone can push the folder past the cut
    assert ended == [f"{staying.pid}: {(' '.join(argv) + ' ')[:200]}"]

"""Issue 48: ``lab.load`` on a folder of results handed around. A link, FIFO or device is refused by name in
under a second (main was OOM-killed reading /dev/zero, and blocked forever on a FIFO), and a file that would
break later (duplicate columns, a digest that is a number, a dtype pandas cannot build) is refused at load,
naming the file. Each test failed on the code before the fix."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import commhooks_lab as lab

QUICK_S = 30
LOAD = "import sys, commhooks_lab as lab; lab.load(sys.argv[1]); print('loaded')"


def _result() -> lab.Result:
    steps = pd.DataFrame(
        {
            "step": [0, 1],
            "loss": [2.0, 1.5],
            "accuracy": [float("nan"), 0.5],
            "payload_bytes": [10, 10],
            "uncompressed_bytes": [20, 20],
            "compressing": [True, True],
            "step_time_s": [0.1, 0.1],
        }
    )
    layers = pd.DataFrame({"step": [0, 1], "layer": ["w", "w"], "rel_error": [0.1, 0.2]})
    return lab.Result({"hook": "fp16", "steps": 2}, steps, layers, [], {"task": "t"}, {"param_digests": ["a", "a"]})


def _limit_memory():  # main read /dev/zero until memory ran out: keep that from the machine
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def _load_elsewhere(path: Path) -> subprocess.CompletedProcess:
    """lab.load in a process of its own: a read that blocks or eats memory fails the test, not the machine."""
    return subprocess.run(
        [sys.executable, "-c", LOAD, str(path)],
        capture_output=True,
        text=True,
        timeout=QUICK_S,
        preexec_fn=_limit_memory,
    )


@pytest.mark.parametrize("special", ["device link", "fifo", "link out"])
@pytest.mark.parametrize("named", ["the folder", "the file"])
def test_a_link_fifo_or_device_is_refused_by_name_in_under_a_second(tmp_path, special, named):
    folder = tmp_path / "results"
    folder.mkdir()
    _result().save(folder / "00_fp16.json")
    bad = folder / "01_bf16.json"
    if special == "device link":
        os.symlink("/dev/zero", bad)
    elif special == "fifo":
        os.mkfifo(bad)
    else:
        _result().save(tmp_path / "elsewhere.json")
        os.symlink("../elsewhere.json", bad)
    if special == "link out" and named == "the file":
        assert isinstance(lab.load(bad), lab.Result)  # a link the learner names is theirs to follow, to a file
        return
    started = time.monotonic()
    done = _load_elsewhere(folder if named == "the folder" else bad)
    assert time.monotonic() - started < QUICK_S
    assert done.returncode == 1 and "loaded" not in done.stdout
    assert "01_bf16.json is a" in done.stderr.splitlines()[-1], done.stderr[-800:]
    started = time.monotonic()
    with pytest.raises(ValueError, match="01_bf16.json is a"):
        lab.load(folder if named == "the folder" else bad)
    assert time.monotonic() - started < 1


def _saved_document(tmp_path) -> dict:
    path = _result().save(tmp_path / "good.json")
    assert isinstance(lab.load(path), lab.Result)
    return json.loads(path.read_text())


def _duplicate_column(d: dict) -> None:
    d["steps"]["columns"][0] = "payload_bytes"


@pytest.mark.parametrize(
    "damage, says",
    [
        (_duplicate_column, r"steps\.columns names \['payload_bytes'\] more than once"),
        (lambda d: d["final"].update(param_digests=5), r"final\.param_digests must be a list of strings"),
        (lambda d: d["steps"]["dtypes"].update(loss="string[pyarrow]"), "not types the lab saves"),
        (lambda d: d["steps"]["dtypes"].update(loss="S2000000000"), "not types the lab saves"),
        (lambda d: d["final"].update(loss="low"), r"final\.loss must be a number"),
    ],
)
def test_a_result_that_would_break_later_is_refused_at_load_naming_the_file(tmp_path, damage, says):
    document = _saved_document(tmp_path)
    damage(document)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"bad\.json: .*" + says):
        lab.load(bad)


def test_an_integer_of_thousands_of_digits_is_refused_naming_the_file(tmp_path):
    document = _saved_document(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document).replace('"steps": 2', '"steps": ' + "9" * 5000, 1))
    with pytest.raises(ValueError, match=r"bad\.json holds an integer of 5000 digits"):
        lab.load(bad)


def test_saving_over_a_link_replaces_the_link_and_leaves_its_target_alone(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "results").mkdir()
    os.symlink("../victim.txt", tmp_path / "results" / "00_fp16.json")
    _result().save(tmp_path / "results" / "00_fp16.json")
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "results" / "00_fp16.json").is_symlink()
    assert isinstance(lab.load(tmp_path / "results"), lab.ResultSet)

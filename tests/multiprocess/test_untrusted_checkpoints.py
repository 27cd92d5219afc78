"""Issue 48: a checkpoint folder handed around, and values that used to pass the check and fail inside the ranks.
A FIFO in the folder, a forged world_size, JSON built to exhaust the parser and a pickle that runs code are each
refused before any rank starts, naming the file. Each test failed on the code before the fix."""

from __future__ import annotations

import json
import os
import pickle
import resource
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from test_checkpoint import _fake_checkpoint  # run.json and both ranks' files of one save, no ranks

import commhooks_lab as lab
from commhooks_lab import ExperimentConfig
from commhooks_lab.engine import checkpoint

QUICK_S = 30
CHECK = (
    "import sys; from commhooks_lab import ExperimentConfig; "
    "ExperimentConfig(steps=10, resume_from=sys.argv[1]).check()"
)


def _limit_memory():  # main listed 10**9 rank files: keep that from the machine
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def _check_elsewhere(folder) -> subprocess.CompletedProcess:
    """The pre-start check in a process of its own: a read that blocks fails the test, not the run."""
    run = [sys.executable, "-c", CHECK, str(folder)]
    return subprocess.run(run, capture_output=True, text=True, timeout=QUICK_S, preexec_fn=_limit_memory)


@pytest.mark.parametrize("name", ["run.json", "rank1.pt", "rank0.json"])
def test_a_fifo_in_a_checkpoint_is_refused_by_name_before_ranks_start(tmp_path, name):
    _fake_checkpoint(tmp_path, ExperimentConfig(steps=10))
    (tmp_path / name).unlink()
    os.mkfifo(tmp_path / name)
    started = time.monotonic()
    done = _check_elsewhere(tmp_path)
    assert time.monotonic() - started < QUICK_S
    assert f"{name} is a FIFO (named pipe)" in done.stderr.splitlines()[-1], done.stderr[-600:]


def test_a_link_in_a_checkpoint_is_refused_by_name(tmp_path):
    _fake_checkpoint(tmp_path / "ckpt", ExperimentConfig(steps=10))
    os.rename(tmp_path / "ckpt" / "rank1.pt", tmp_path / "elsewhere.pt")
    os.symlink("../elsewhere.pt", tmp_path / "ckpt" / "rank1.pt")
    with pytest.raises(checkpoint.CheckpointError, match=r"rank1\.pt is a symbolic link"):
        ExperimentConfig(steps=10, resume_from=tmp_path / "ckpt").check()


def test_a_forged_world_size_is_compared_before_any_rank_file_is_probed(tmp_path):
    _fake_checkpoint(tmp_path, ExperimentConfig(steps=10))
    meta = json.loads((tmp_path / "run.json").read_text())
    meta["world_size"] = meta["config"]["world_size"] = 10**9
    (tmp_path / "run.json").write_text(json.dumps(meta))
    started = time.monotonic()
    done = _check_elsewhere(tmp_path)
    assert time.monotonic() - started < QUICK_S
    assert "world_size: checkpoint 1000000000, now 2" in done.stderr.splitlines()[-1], done.stderr[-600:]


def test_a_world_size_the_folder_has_no_files_for_is_refused_from_one_listing(tmp_path, monkeypatch):
    """Under torchrun a config may really ask for many ranks: the folder's listing answers, not 10**9 probes."""
    config = ExperimentConfig(steps=10)
    _fake_checkpoint(tmp_path, config)
    meta = json.loads((tmp_path / "run.json").read_text())
    meta["world_size"] = 10**9
    monkeypatch.setattr(checkpoint, "_read_json", lambda path: pytest.fail(f"probed {path.name}"))
    with pytest.raises(checkpoint.CheckpointError, match="world_size=1000000000, the folder holds files for 2 ranks"):
        checkpoint.check_files(tmp_path, meta)


@pytest.mark.parametrize(
    "name, text, says",
    [
        ("rank0.json", "[" * 200_000, r"rank0\.json nests its lists and objects deeper"),
        ("run.json", None, r"run\.json holds an integer of 5000 digits"),
    ],
)
def test_json_built_to_exhaust_the_parser_is_refused_naming_the_file(tmp_path, name, text, says):
    _fake_checkpoint(tmp_path, ExperimentConfig(steps=10))
    if text is None:
        text = (tmp_path / name).read_text().replace('"step": 4', '"step": ' + "4" * 5000)
    (tmp_path / name).write_text(text)
    with pytest.raises(checkpoint.CheckpointError, match=says):
        ExperimentConfig(steps=10, resume_from=tmp_path).check()


class RunsCode:
    def __reduce__(self):
        return (print, ("this ran",))


def test_a_pickle_that_would_run_code_is_refused_with_pytorchs_reason_whole(tmp_path, capsys):
    checkpoint.save_tree(tmp_path / "x", {"t": torch.zeros(1)})
    with open(tmp_path / "x.pt", "wb") as f:
        pickle.dump({"t": RunsCode()}, f, protocol=2)
    with pytest.raises(checkpoint.CheckpointError) as refused:
        checkpoint.load_tree(tmp_path / "x")
    message = str(refused.value)
    assert "WeightsUnpickler error: Unsupported global: GLOBAL print was not an allowed global by default)" in message
    assert "with weights_only=False would run any code it holds" in message
    assert "Re-running `torch.load`" not in message  # PyTorch's advice, cut mid-sentence on main
    assert "this ran" not in capsys.readouterr().out


# -- values that passed the check and then failed inside the ranks (item 11) -------------------------------


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"lr": 1e39}, "lr must be a finite number > 0, at most 1e"),
        ({"timeout_s": 1e-9}, "timeout_s=1e-09 is shorter than the ranks can meet in"),
        ({"label": object()}, "label must be a string"),
    ],
)
def test_values_that_failed_inside_the_ranks_are_refused_before_they_start(changes, says):
    with pytest.raises((ValueError, TypeError), match=says):
        ExperimentConfig(**changes).check()


@pytest.mark.parametrize("seed", [np.int64(5), np.int32(5), np.uint8(5), np.uint32(5)])
def test_a_numpy_integer_seed_is_the_integer_it_is(seed):
    config = ExperimentConfig(seed=seed)
    assert config.seed == 5 and type(config.seed) is int
    assert json.loads(json.dumps(config.to_dict()))["seed"] == 5


def test_a_numpy_seed_runs_as_the_same_integer(cluster):
    """``for seed in np.arange(3)``: main failed in every rank with "TypeError: an integer is required"."""
    as_int = lab.run(steps=2, seed=3, cluster=cluster)
    as_numpy = lab.run(steps=2, seed=np.arange(5)[3], cluster=cluster)
    assert as_numpy.final["param_digests"] == as_int.final["param_digests"]

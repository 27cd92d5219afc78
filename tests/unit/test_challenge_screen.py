"""The challenge's screen and submission reader: each cheating kind refused by name before anything runs, a fair
hook (PyTorch's hooks included) let through, a notebook's tagged cells read and nothing else."""

import json

import pytest

from commhooks_lab.challenge.screen import screen
from commhooks_lab.challenge.submission import read_submission

FAIR = """
import math
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook


def make_state(process_group):
    return PowerSGDState(process_group, matrix_approximation_rank=2, start_powerSGD_iter=2)


def hook(state, bucket):
    state.seen = getattr_free = math.prod(bucket.buffer().shape)
    return powerSGD_hook(state, bucket)
"""

CHEATS = {
    "import gc\n": "reaches into other code's objects",
    "x = ().__class__.__mro__\n": "a private or special attribute",
    "import commhooks_lab.measure.payload\n": "reaches into other code's objects",
    "import torch.distributed as dist\ndist.all_reduce = print\n": "patches a library",
    "from torch.distributed import _functional_collectives\n": "a private name",
    "import socket\n": "talks to the network",
    "import torch\ntorch.hub.load('a', 'b')\n": "talks to the network",
    "open('/tmp/x', 'w')\n": "touches files outside its folder",
    "import torch\ntorch.save({}, '/tmp/x')\n": "touches files",
    "import os\nos.fork()\n": "forks or runs other processes",
    "import torch\ntorch.os.fork()\n": "forks or runs other processes",
    "from torch import multiprocessing\n": "forks or runs other processes",
    "exec('import os')\n": "runs code the screen has not read",
    "getattr(print, 'x')\n": "reaches attributes the screen cannot read",
}


def test_a_fair_hook_passes_the_screen():
    assert screen(FAIR) == []


@pytest.mark.parametrize("source", list(CHEATS))
def test_each_cheating_kind_is_refused_with_its_kind(source):
    problems = screen(source)
    assert problems and any(CHEATS[source] in p.why for p in problems), problems


def test_a_harmless_name_refused_with_a_dangerous_ones_says_why_it_was_caught():
    """The screen reads names, not types: a tensor's select or a private generator's manual_seed is refused, and
    the reason says it is the name, not what the learner meant."""
    (select,) = screen("def hook(state, bucket):\n    return bucket.buffer().select(0, 1)\n")
    assert select.why.startswith("talks to the network, if it is the module select") and "a tensor method" in select.why
    (seed,) = screen("import torch\ng = torch.Generator()\ng.manual_seed(1)\n")
    assert "a private generator's is refused too" in seed.why
    (utils,) = screen("import torch\ntorch.nn.utils.parameters_to_vector([])\n")
    assert "torch.nn.utils is refused too" in utils.why


def test_a_notebook_submission_is_its_tagged_cells(tmp_path):
    cell = {
        "cell_type": "code",
        "metadata": {"tags": ["challenge"]},
        "outputs": [],
        "source": ["def hook(s, bucket):\n", "    pass\n"],
    }
    other = {"cell_type": "code", "metadata": {}, "outputs": [], "source": "import os\n"}
    path = tmp_path / "entry.ipynb"
    path.write_text(json.dumps({"cells": [cell, other], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    submission = read_submission(path)
    assert submission.label == "entry" and "def hook(s, bucket)" in submission.source and "os" not in submission.source
    cell["metadata"] = {}
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    with pytest.raises(ValueError, match="no code cell tagged 'challenge'"):
        read_submission(path)


def test_the_command_line_scores_a_file_and_names_why_it_was_refused(tmp_path, capsys):
    """``commhooks-lab challenge score FILE``: a refused entry exits 1 with its reason, before any process starts."""
    import commhooks_lab as lab
    from commhooks_lab import cli

    entry = tmp_path / "mine.py"
    entry.write_text("import socket\n\ndef hook(state, bucket):\n    pass\n")
    assert cli.main(["challenge", "score", str(entry)]) == 1
    out = capsys.readouterr().out
    assert "mine: DISQUALIFIED: refused before it ran: line 1: import socket: talks to the network" in out
    args = cli.build_parser().parse_args(["challenge", "leaderboard", str(tmp_path), "--no-baselines"])
    assert args.func.__name__ == "_challenge_leaderboard" and args.no_baselines
    import commhooks_lab.challenge.score  # noqa: F401  (the module, imported by its full name)

    assert callable(lab.challenge.score) and callable(lab.challenge.screen)  # the notebook's lab.challenge.score(hook)

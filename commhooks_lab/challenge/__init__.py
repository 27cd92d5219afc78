"""The hook challenge (issue 51): score a communication hook of your own on a fixed task set, the same bits on every
x86-64 CPU, and build an offline leaderboard from a folder of submissions.

- ``tasks.py``: the fixed task set, its seeds and steps, and the reference network of the α/β model;
- ``score.py``: :func:`score` runs a hook on every task and returns a :class:`Score`: its parts and one number;
- ``screen.py``: what a submission's source may use, checked before it runs;
- ``submission.py``: a submission's hook, from a Python file or a notebook's tagged cell;
- ``sandbox.py``: a submission scored in a child process of its own (time and memory budget, its own folder,
  a private network where the machine allows one), and the child's side (``python -m
  commhooks_lab.challenge.sandbox``);
- ``leaderboard.py``: every submission of a folder re-run, one offline HTML page.

May import the notebook API, the studies and every layer below them; the CLI imports it.
"""

from __future__ import annotations

# The functions named like their modules are bound here, after their modules: ``lab.challenge.score`` is the
# function even once ``commhooks_lab.challenge.score`` (the module) has been imported. All of these are light:
# torch and pandas load when a score runs.
from .leaderboard import leaderboard
from .sandbox import Budget, score_file
from .score import BASELINES, FORMULA, Score, baselines, score, table
from .screen import screen
from .tasks import REFERENCE_NETWORK, TASKS, ChallengeTask

__all__ = [
    "BASELINES",
    "Budget",
    "ChallengeTask",
    "FORMULA",
    "REFERENCE_NETWORK",
    "Score",
    "baselines",
    "TASKS",
    "leaderboard",
    "score",
    "score_file",
    "screen",
    "table",
]

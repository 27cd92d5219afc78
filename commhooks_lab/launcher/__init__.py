"""Start DDP ranks from a notebook (or join torchrun's), run functions on them, explain failures.

This subpackage knows nothing about hooks or experiments and never imports the engine: it is
a general in-notebook launcher that the engine builds on (a test checks the direction).
"""

from __future__ import annotations

from .allreduce_check import selfcheck
from .cluster import Cluster
from .errors import WorkerError, WorkerTimeoutError
from .one_shot import launch
from .rank_process import WorkerContext
from .rank_spec import RankSpec
from .ranks import Ranks
from .topology import Topology
from .torchrun import launch_from_env, under_torchrun

__all__ = [
    "Cluster",
    "WorkerContext",
    "WorkerError",
    "WorkerTimeoutError",
    "launch",
    "launch_from_env",
    "Ranks",
    "RankSpec",
    "selfcheck",
    "Topology",
    "under_torchrun",
]

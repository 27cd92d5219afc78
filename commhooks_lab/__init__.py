"""commhooks_lab: run, measure and see PyTorch DDP communication hooks from a notebook.

Heavy parts (pandas, matplotlib, ipywidgets) load on first use, so the rank processes,
which import this package, start as fast as ``import torch`` allows. Importing it in a notebook
kernel starts the rank server (a forkserver that imports torch once, so the first run's ranks
start in a fork's time) and imports a run's own modules on a background thread; a script starts
nothing until it runs something. ``COMMHOOKS_LAB_PREWARM=0`` turns both off, ``=1`` on in a script too.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: The notebook API: name -> the module that defines it (imported on first use).
_EXPORTS = {
    "launch": "launcher",
    "Cluster": "launcher",
    "WorkerError": "launcher",
    "WorkerTimeoutError": "launcher",
    "WorkerContext": "launcher",
    "launch_from_env": "launcher",
    "selfcheck": "launcher",
    "ExperimentConfig": "engine.config",
    "run": "experiment",
    "compare": "experiment",
    "Result": "result",
    "ResultSet": "result",
    "load": "result",
    "available_hooks": "studies.availability",
    "check_hook_choice": "hooks.choice",
    "Task": "engine.models",
    "HookLab": "widgets",
}

#: Modules a notebook reaches as attributes (``lab.plots.overview``), imported on first use: public name -> module.
_SUBMODULES = {
    "plots": "plots",
    "widgets": "widgets",
    "result": "result",
    "doctor": "doctor",
    "testing": "testing",
    "exercises": "exercises",
    "studies": "studies",
    "network": "studies.network",
    "precision": "studies.precision",
    "registry": "hooks.registry",
    "compressors": "hooks.compressors",
    "contract": "hooks.contract",
    "models": "engine.models",
    "checkpoint": "engine.checkpoint",
    "session": "launcher.session",
    "numerics": "launcher.numerics",
    "challenge": "challenge",
}

__all__ = sorted(_EXPORTS) + sorted(_SUBMODULES)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f".{_SUBMODULES[name]}", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'commhooks_lab' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(shell) -> None:
    """``%load_ext commhooks_lab``: the ``%ddp`` / ``%%ddp`` magics (:mod:`commhooks_lab.magics`)."""
    from .magics import load_ipython_extension as load

    load(shell)


from .launcher import numerics as _numerics  # noqa: E402

#: What portable numerics could not pin any more in this process (torch ran before the import); see ``doctor``.
NUMERICS_PROBLEMS = _numerics.apply_here()

from .launcher import prewarm as _prewarm  # noqa: E402  (the rank server and the first run's imports, in the background)


def _import_a_runs_share() -> None:
    """What a run imports in the notebook's own process (torch, pandas and the engine come with it)."""
    from . import experiment  # noqa: F401


#: What a run's ranks import: the rank server loads it once (by name: it is another interpreter).
_prewarm.start(rank_modules=("numpy", "commhooks_lab.engine.dispatch"), kernel_imports=_import_a_runs_share)

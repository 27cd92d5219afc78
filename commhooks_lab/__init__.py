"""commhooks_lab: run, measure and see PyTorch DDP communication hooks from a notebook.

Heavy parts (pandas, matplotlib, ipywidgets) load on first use, so the rank processes,
which import this package, start as fast as ``import torch`` allows. Importing it in a notebook
or script starts the rank server (a forkserver that imports torch once, so the first run's ranks
start in a fork's time) and imports a run's own modules on a background thread;
``COMMHOOKS_LAB_PREWARM=0`` turns both off.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "launch": "launcher",
    "Cluster": "launcher",
    "WorkerError": "launcher",
    "WorkerTimeoutError": "launcher",
    "WorkerContext": "launcher",
    "launch_from_env": "launcher",
    "selfcheck": "launcher",
    "ExperimentConfig": "config",
    "run": "experiment",
    "compare": "experiment",
    "Result": "result",
    "ResultSet": "result",
    "load": "result",
    "available_hooks": "availability",
    "check_hook_choice": "hooks",
    "Task": "models",
    "HookLab": "widgets",
}

__all__ = sorted(_EXPORTS)


#: Submodules reachable as attributes (``lab.plots.overview``), imported on first use.
_SUBMODULES = (
    "plots",
    "hooks",
    "registry",
    "compressors",
    "netmodel",
    "studies",
    "exercises",
    "widgets",
    "models",
    "probe",
    "result",
    "scaling",
    "checkpoint",
    "contract",
    "doctor",
    "testing",
    "compile_compat",
    "session",
    "numerics",
)


def __getattr__(name: str):
    if name == "numerics":
        return _numerics
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'commhooks_lab' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__ + list(_SUBMODULES))


from .launcher import numerics as _numerics  # noqa: E402

#: What portable numerics could not pin any more in this process (torch ran before the import); see ``doctor``.
NUMERICS_PROBLEMS = _numerics.apply_here()

from . import _prewarm  # noqa: E402  (the rank server and the first run's imports, in the background)

_prewarm.start()

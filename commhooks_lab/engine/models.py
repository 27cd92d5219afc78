"""The tasks the lab trains: real handwritten digits (shipped with scikit-learn) and a synthetic
task whose gradients have a known low rank. Nothing is downloaded.

A task is a model, a training set, an optional test set and a loss. ``model="module:function"``
or a callable ``factory(seed) -> Task`` brings your own.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._util import import_object
from .seed_set import effective_seed

__all__ = [
    "build_task",
    "cnn_task",
    "digits",
    "effective_seed",
    "LOWRANK_TRUE_RANK",
    "mlp_task",
    "resolve_task_factory",
    "Task",
    "TASKS",
    "wide_task",
]

TASKS = ("mlp", "cnn", "lowrank", "wide")
TASK_SUMMARIES = {
    "mlp": "digits 8x8 -> MLP 64-128-10 (scikit-learn load_digits, 1797 real handwritten digits)",
    "cnn": "digits 8x8 -> CNN conv16-conv32-pool-linear (same data)",
    "lowrank": "synthetic regression whose weight gradients have rank <= 4 (inputs in a 4-dim subspace)",
    "wide": "digits 8x8 -> MLP 64-1024-1024-10 (1,126,410 parameters, 4.5 MB of float32 gradients: a link matters)",
}
#: The wide MLP's hidden width: 1024 x 1024 is the one large matrix, PowerSGD's best case for a matrix of its size.
WIDE_HIDDEN = 1024
LOWRANK_TRUE_RANK = 4


@dataclass
class Task:
    model: nn.Module
    train: torch.utils.data.Dataset
    test: torch.utils.data.Dataset | None
    loss: str  # "cross_entropy" or "mse"
    description: str = ""

    def loss_fn(self) -> Callable:
        losses: dict[str, Callable] = {"cross_entropy": nn.functional.cross_entropy, "mse": nn.functional.mse_loss}
        return losses[self.loss]


@functools.lru_cache(maxsize=1)
def _digits_arrays():
    """``load_digits()``'s ``(data, target)``, read from the file scikit-learn ships as it reads it.

    Importing scikit-learn costs a rank about a second; finding its data file costs nothing.
    Falls back to ``load_digits`` if the file is not where scikit-learn keeps it.
    """
    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(roots[0], "datasets", "data", "digits.csv.gz") if roots else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        data = load_digits()
        return data.data, data.target
    import gzip

    with gzip.open(path, mode="rt", encoding="utf-8") as lines:
        table = np.loadtxt(lines, delimiter=",")
    return table[:, :-1], table[:, -1].astype(int, copy=False)


def digits(seed: int = 0, test_fraction: float = 0.2, as_images: bool = False):
    """scikit-learn's 1797 8x8 digits, scaled to [0, 1], split with a fixed permutation."""
    data, target = _digits_arrays()
    x = torch.tensor(data, dtype=torch.float32) / 16.0
    y = torch.tensor(target, dtype=torch.long)
    if as_images:
        x = x.view(-1, 1, 8, 8)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    ds = torch.utils.data.TensorDataset
    return ds(x[train], y[train]), ds(x[test], y[test])


def mlp_task(seed: int = 0) -> Task:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    train, test = digits(seed)
    return Task(model, train, test, "cross_entropy", TASK_SUMMARIES["mlp"])


def wide_task(seed: int = 0) -> Task:
    """The digits MLP made wide enough that its gradients take a slow link seconds (notebook 8's timing task)."""
    torch.manual_seed(seed)
    h = WIDE_HIDDEN
    model = nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
    train, test = digits(seed)
    return Task(model, train, test, "cross_entropy", TASK_SUMMARIES["wide"])


def cnn_task(seed: int = 0) -> Task:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 10),
    )
    train, test = digits(seed, as_images=True)
    return Task(model, train, test, "cross_entropy", TASK_SUMMARIES["cnn"])


def _lowrank_task(
    seed: int = 0, n: int = 2048, d_in: int = 256, d_out: int = 128, rank: int = LOWRANK_TRUE_RANK
) -> Task:
    """y = W* x with every x in one ``rank``-dim subspace: each weight gradient
    (sum of outer products err x^T) then has rank <= ``rank``, on every rank and in the mean."""
    gen = torch.Generator().manual_seed(seed + 1)
    basis = torch.randn(rank, d_in, generator=gen) / d_in**0.5
    x = torch.randn(n, rank, generator=gen) @ basis
    teacher = torch.randn(d_in, d_out, generator=gen)
    y = x @ teacher
    torch.manual_seed(seed)
    model = nn.Linear(d_in, d_out, bias=False)
    ds = torch.utils.data.TensorDataset
    return Task(model, ds(x, y), None, "mse", TASK_SUMMARIES["lowrank"])


BUILDERS = {"mlp": mlp_task, "cnn": cnn_task, "lowrank": _lowrank_task, "wide": wide_task}


def resolve_task_factory(model: Any) -> Callable[[int], Task]:
    """A task name, a callable ``factory(seed) -> Task``, or ``"module:function"``."""
    if isinstance(model, str):
        if model in BUILDERS:
            return BUILDERS[model]
        if ":" in model:
            return _takes_a_seed(import_object(model, "model factory"), model)
        raise ValueError(
            f"unknown model {model!r}; choose one of {list(TASKS)}, or pass factory(seed) -> Task or 'module:function'"
        )
    if callable(model):
        return _takes_a_seed(model, getattr(model, "__name__", repr(model)))
    raise ValueError(f"model must be a name, a callable or 'module:function', got {model!r}")


def _takes_a_seed(factory: Callable, name: str) -> Callable[[int], Task]:
    """``factory``, if it can be called as ``factory(seed)``: checked here, not in every rank after they start."""
    try:
        inspect.signature(factory).bind(0)
    except TypeError:
        raise TypeError(f"model factory {name} cannot be called as factory(seed) -> Task") from None
    except ValueError:  # no signature to read (some builtins): the ranks will say
        pass
    return factory


def build_task(model: Any, seed: int) -> Task:
    """The task ``model`` names, built from ``seed`` (shifted by the seed set: :func:`effective_seed`)."""
    task = resolve_task_factory(model)(effective_seed(seed))
    if not isinstance(task, Task):
        raise TypeError(f"a model factory must return commhooks_lab.engine.models.Task, got {type(task).__name__}")
    return task

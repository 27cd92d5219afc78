"""Ready-made line-ups for the questions notebooks 8 and 9 ask, each one ``compare`` call away.

- :func:`headroom_study`: PyTorch's headroom test (``noop``: no communication at all) next to DDP's
  own all-reduce, the allreduce hook and fp16, timed step by step.
- :func:`convergence_study`: does training still converge? The same line-up over several seeds,
  test accuracy every few steps; :func:`convergence_summary` gives mean and sd over seeds and
  says which runs diverged.
- :func:`payoff_lineup`: the hooks both use, by registry name, so that
  :func:`commhooks_lab.studies.network.rule_traffic` can predict their bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from ..engine.config import ExperimentConfig
from ..experiment import as_config, compare
from ..hooks.powersgd import SHORT_RUN_START
from ..result import Result, ResultSet
from .side_by_side import compare_side_by_side, ranks_side_by_side

__all__ = ["convergence_study", "convergence_summary", "diverged", "headroom_study", "payoff_lineup", "power_sgd"]

HEADROOM_LINEUP = ("no", "allreduce", "noop", "fp16")


def power_sgd(
    matrix_rank: int, error_feedback: bool = True, warm_start: bool = True, start: int = SHORT_RUN_START
) -> dict:
    """A PowerSGD run that compresses from step ``start``; error feedback and warm start are separate switches."""
    return {
        "hook": "power_sgd",
        "state_options": {
            "matrix_approximation_rank": matrix_rank,
            "start_powerSGD_iter": start,
            "use_error_feedback": error_feedback,
            "warm_start": warm_start,
        },
    }


def payoff_lineup() -> list:
    """fp32 and fp16 all-reduce, PowerSGD (matrix rank 1 with each switch off in turn; 4), top-k and sign with EF."""
    return [
        "allreduce",
        "fp16",
        power_sgd(1),
        power_sgd(1, error_feedback=False),
        power_sgd(1, warm_start=False),
        power_sgd(4),
        {"hook": "topk", "state_options": {"ratio": 0.01, "error_feedback": True}},
        {"hook": "sign", "state_options": {"error_feedback": True}},
    ]


def headroom_study(model: str = "cnn", steps: int = 40, warmup_steps: int = 10, **changes) -> ResultSet:
    """Step times without measuring the error (``measure=False``: the probe only counts bytes).

    A first, discarded run of ``warmup_steps`` keeps the ranks' first-use costs (imports, allocations)
    out of the timed runs.
    """
    changes.setdefault("measure", False)
    cluster = changes.pop("cluster", None)
    if cluster is None:  # ranks of its own, as the runs ask for them (world size, link, backend, timeout)
        from ..launcher import Ranks

        with Ranks(fresh=True) as ranks:
            own = ranks(ExperimentConfig(model=model, **changes).rank_spec())
            return headroom_study(model, steps, warmup_steps, cluster=own, **changes)
    if warmup_steps:
        compare(["noop"], steps=warmup_steps, model=model, cluster=cluster, **changes)
    return compare(list(HEADROOM_LINEUP), steps=steps, model=model, cluster=cluster, **changes)


def convergence_study(
    seeds: Sequence[int] = (0, 1, 2),
    steps: int = 60,
    model: str = "cnn",
    eval_every: int = 10,
    lineup: list | None = None,
    side_by_side: int = 1,
    **changes,
) -> ResultSet:
    """Every hook of ``lineup`` (default :func:`payoff_lineup`) once per seed: seed changes the model's
    initial weights, the train/test split and the batch order, the same for every hook.

    ``side_by_side=2`` shares the runs out over two sets of ranks at once (``cluster`` or the session's, and
    one more started for the study): the same results, in the same order, sooner where the ranks would
    otherwise wait (:mod:`.side_by_side`).
    """
    changes.setdefault("measure", False)
    cluster, fresh = changes.pop("cluster", None), changes.pop("fresh", False)
    items = payoff_lineup() if lineup is None else lineup
    base = ExperimentConfig().replace(steps=steps, model=model, eval_every=eval_every, **changes)
    configs = [as_config(item, base.replace(seed=seed)) for seed in seeds for item in items]
    if side_by_side == 1:
        return compare(configs, cluster=cluster, fresh=fresh)
    with ranks_side_by_side(cluster, side_by_side, base, fresh=fresh) as clusters:
        return compare_side_by_side(configs, clusters)


def diverged(result: Result, window: int = 10) -> bool:
    """Ended no better than it started: mean training loss of the last ``window`` steps at or above that of
    the first ``window`` (about ln 10 for ten classes), or not finite."""
    loss = result.steps["loss"].to_numpy(dtype=float)
    last = loss[-window:].mean()  # a NaN or inf anywhere in the window carries through (pandas would skip it)
    return bool(not math.isfinite(last) or last >= loss[:window].mean())


def convergence_summary(results: Sequence[Result], window: int = 10) -> pd.DataFrame:
    """Per hook, over seeds: final and best test accuracy (mean, sd), last ``window`` steps' loss, divergences."""
    rows = [
        {
            "hook": r.name,
            "seed": r.config.get("seed"),
            "accuracy": r.final.get("accuracy", math.nan),
            "best_accuracy": r.steps["accuracy"].max(),
            "loss": r.steps["loss"].iloc[-window:].mean(),
            "diverged": diverged(r, window),
        }
        for r in results
    ]
    table = pd.DataFrame(rows)
    grouped = table.groupby("hook", sort=False)
    summary = pd.DataFrame(
        {
            "accuracy_mean": grouped["accuracy"].mean(),
            "accuracy_sd": grouped["accuracy"].std(ddof=1),
            "best_accuracy_mean": grouped["best_accuracy"].mean(),
            f"loss_last_{window}_mean": grouped["loss"].mean(),
            "diverged": grouped["diverged"].sum().astype(int).astype(str) + "/" + grouped.size().astype(str),
        }
    )
    return summary

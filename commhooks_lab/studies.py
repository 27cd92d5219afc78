"""Ready-made line-ups for the questions learners ask, each one ``compare`` call away.

- :func:`convergence_study`: does training still converge? loss and accuracy per step on real
  digits for exact, fp16, PowerSGD (with and without error feedback), top-k and EF-SignSGD.
- :func:`network_study`: the runs :mod:`commhooks_lab.netmodel` needs to say when each hook
  pays off (noop for compute time, allreduce as the baseline).
"""

from __future__ import annotations

from .compressors import QSGD, ErrorFeedback, Int8PerChannel, ScaledSign, TopK
from .experiment import compare
from .result import ResultSet


def _powersgd(rank: int, error_feedback: bool = True) -> dict:
    label = f"power_sgd r{rank}" + ("" if error_feedback else " no EF")
    return {
        "hook": "power_sgd",
        "label": label,
        "state_options": {
            "matrix_approximation_rank": rank,
            "start_powerSGD_iter": 2,
            "use_error_feedback": error_feedback,
            "warm_start": error_feedback,
        },
    }


def convergence_lineup() -> list:
    return (
        ["allreduce", "fp16"]
        + [_powersgd(r, ef) for ef in (True, False) for r in (1, 2, 4)]
        + [ErrorFeedback(TopK(0.01)), ErrorFeedback(ScaledSign())]
    )


def network_lineup() -> list:
    return ["allreduce", "noop", "fp16", _powersgd(1), _powersgd(4)] + [
        ErrorFeedback(TopK(0.01)),
        ErrorFeedback(ScaledSign()),
        QSGD(16),
        Int8PerChannel(),
    ]


def convergence_study(steps: int = 60, model: str = "cnn", eval_every: int = 5, **changes) -> ResultSet:
    """Same seed, same data, one call: how each hook trains the digits CNN."""
    return compare(convergence_lineup(), steps=steps, model=model, eval_every=eval_every, **changes)


def network_study(steps: int = 12, model: str = "cnn", **changes) -> ResultSet:
    """Measure bytes and local times for the network model (:func:`commhooks_lab.netmodel.network_model`)."""
    return compare(network_lineup(), steps=steps, model=model, **changes)

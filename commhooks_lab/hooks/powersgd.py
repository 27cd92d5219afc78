"""PowerSGD and batched PowerSGD (``powerSGD_hook.py``): their checks, names, byte rules and short-run start."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from .. import _compat
from .registry import HOOK, Builder, HookEntry, register
from .traffic import Shape, Traffic, allreduced, bucket_sizes, numel

__all__ = ["BATCHED_POWER_SGD_NOTE", "compressed_elements", "SHORT_RUN_START"]

#: The lab's short runs compress from step 2, the first PyTorch allows with error feedback or warm
#: start (its default, 1000, would never compress in a short run).
SHORT_RUN_START = 2

BATCHED_POWER_SGD_NOTE = (
    "batched_power_sgd: PyTorch's batched_powerSGD_hook hands a 2-D matrix to _orthogonalize, which "
    "asserts a 3-D batch (a bare AssertionError on CPU and GPU alike). The lab lets _orthogonalize treat a "
    "2-D matrix as a batch of one (a view: the same numbers in place); 3-D inputs, PowerSGD's own, are "
    "untouched."
)
_NEEDS_BUCKETS = (
    "PowerSGD works on whole buckets: bucket.index() keys its error feedback and warm-start memory and "
    "bucket.is_last() counts its steps, and under compiled autograd DDP passes one (param.grad, param) at a time"
)


def _build(attribute: str) -> Builder:
    def build(options: dict, process_group: Any) -> tuple:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        return getattr(powerSGD_hook, attribute), powerSGD_hook.PowerSGDState(process_group=process_group, **options)

    return build


def _check(options: dict) -> None:
    """PowerSGDState's own rules, said before any process starts."""
    rank = options.get("matrix_approximation_rank", 1)
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(
            f"matrix_approximation_rank must be an int >= 1, got {rank!r}: it is the matrix rank r "
            "of the approximation P Q^T"
        )
    start = options.get("start_powerSGD_iter", _compat.power_sgd_defaults()["start_powerSGD_iter"])
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"start_powerSGD_iter must be an int >= 0, got {start!r}")
    ef, warm = options.get("use_error_feedback", True), options.get("warm_start", True)
    if (ef or warm) and start <= 1:
        raise ValueError(
            f"start_powerSGD_iter={start} with use_error_feedback={ef} and warm_start={warm}: PyTorch refuses this "
            "(ValueError in PowerSGDState). DDP rebuilds its gradient buckets after the first iteration, so the "
            "error and P/Q tensors remembered per bucket would no longer fit. Use start_powerSGD_iter >= 2, or "
            "turn both use_error_feedback and warm_start off."
        )
    if options.get("min_compression_rate", 2) < 0:
        raise ValueError(f"min_compression_rate must be a number >= 0, got {options['min_compression_rate']!r}")


def _run_name(name: str) -> Callable[[dict], str]:
    """``power_sgd r4``, plus the switches that are off: matrix rank and switches tell runs apart."""

    def run_name(options: dict) -> str:
        text = f"{name} r{options.get('matrix_approximation_rank', 1)}"
        if not options.get("use_error_feedback", True):
            text += " no EF"
        if not options.get("warm_start", True):
            text += " no warm start"
        return text

    return run_name


def compressed_elements(shape: Shape, matrix_rank: int, min_compression_rate: float) -> int:
    """Elements PowerSGD all-reduces for one tensor (``_should_compress`` in powerSGD_hook.py)."""
    rows = shape[0] if shape else 1
    cols = numel(shape) // rows
    r = min(rows, cols, matrix_rank)
    compressed = (rows + cols) * r
    return compressed if compressed * min_compression_rate < rows * cols else rows * cols


def _per_layer_traffic(shapes: Sequence[Shape], buckets: int, options: dict) -> Traffic:
    """Per bucket: the uncompressed tensors, then all Ps, then all Qs: three all-reduces."""
    matrix_rank = options.get("matrix_approximation_rank", 1)
    rate = options.get("min_compression_rate", 2.0)
    return allreduced(4 * sum(compressed_elements(s, matrix_rank, rate) for s in shapes), 3 * buckets)


def _batched_traffic(shapes: Sequence[Shape], buckets: int, options: dict) -> Traffic:
    """Each bucket as one square matrix of side ceil(sqrt(numel)): P, then Q, side x r each.

    The buckets are DDP's default ones (:func:`bucket_sizes`); ``buckets`` only checks that.
    """
    sizes = bucket_sizes(shapes)
    if len(sizes) != buckets:
        raise ValueError(f"batched PowerSGD's rule needs DDP's default buckets ({len(sizes)} here), got {buckets}")
    r = options.get("matrix_approximation_rank", 1)
    return allreduced(4 * sum(2 * math.ceil(math.sqrt(n)) * r for n in sizes), 2 * buckets)


def _never_compressed(options: dict, steps: int) -> tuple[str, str]:
    """(why, what to do) when no step of a run compressed."""
    given = options
    options = {**_compat.power_sgd_defaults(), **options}
    start = options["start_powerSGD_iter"]
    if start >= steps:
        default = " (PyTorch's default)" if "start_powerSGD_iter" not in given else ""
        why = (
            f"start_powerSGD_iter={start}{default} >= steps={steps}, and PowerSGD runs plain allreduce before that step"
        )
        fix = (
            f"Set state_options={{'start_powerSGD_iter': {SHORT_RUN_START}}} (Accelerate: comm_state_option) "
            "to compress."
        )
        return why, fix
    rate = options["min_compression_rate"]
    why = f"no gradient matrix passed min_compression_rate={rate} at this rank"
    return why, "Lower min_compression_rate or matrix_approximation_rank to compress."


def _batched_note() -> str | None:
    return BATCHED_POWER_SGD_NOTE if _compat.batched_fix_active() else None


for _name, _attribute, _summary, _traffic in (
    (
        "power_sgd",
        "powerSGD_hook",
        "matrix-rank-r approximation P Q^T of each gradient matrix (Vogels et al. 2019)",
        _per_layer_traffic,
    ),
    (
        "batched_power_sgd",
        "batched_powerSGD_hook",
        "PowerSGD on the whole bucket viewed as one square matrix",
        _batched_traffic,
    ),
):
    _batched = _name == "batched_power_sgd"
    register(
        HookEntry(
            _name,
            HOOK,
            _summary,
            build=_build(_attribute),
            defaults=_compat.power_sgd_defaults,
            check=_check,
            run_name=_run_name(_name),
            accelerate=_name,
            prepare=_compat.patch_batched_orthogonalize if _batched else None,
            rank_note=_batched_note if _batched else None,
            not_compilable=_NEEDS_BUCKETS,
            traffic=_traffic,
            short_run=lambda: {"start_powerSGD_iter": SHORT_RUN_START},
            never_compressed=_never_compressed,
        )
    )

"""The lab's compressors (:mod:`.compressors`) as registry records: one family per compressor.

Compressor families take their parameter and ``error_feedback`` as state options; their byte
rules follow each compressor's payload (values and indices all-gathered, or values all-reduced).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from .registry import COMPRESSOR, HookEntry, register
from .traffic import Shape, Traffic, allreduced, gathered, numel

__all__: list[str] = []


def _kept(shape: Shape, ratio: float) -> int:
    """k = ceil(ratio x numel), at least one entry and at most all of them."""
    return max(1, min(numel(shape), math.ceil(ratio * numel(shape))))


def _gathered_rule(per_tensor: Callable[[Shape, dict], int]) -> Callable[[Sequence[Shape], int, dict], Traffic]:
    """Each tensor's payload all-gathered; two payload dtypes, one gather each, per bucket."""
    return lambda shapes, buckets, options: gathered(shapes, lambda s: per_tensor(s, options), 2, buckets)


def _randomk_traffic(shapes: Sequence[Shape], buckets: int, options: dict) -> Traffic:
    """The same k indices on every rank (a shared seed): the values alone, all-reduced."""
    return allreduced(4 * sum(_kept(s, options.get("ratio", 0.01)) for s in shapes), buckets)


def _compressor_entry(
    name: str,
    summary: str,
    make: Callable[..., Any],
    parameter: tuple[str, float] | None,
    traffic: Callable[[Sequence[Shape], int, dict], Traffic],
) -> HookEntry:
    extra = dict([parameter]) if parameter else {}

    def defaults() -> dict:
        return {**extra, "error_feedback": False, "seed": 0}

    def compressor(options: dict):
        from .compressors import ErrorFeedback

        options = {**defaults(), **options}
        inner = make(**{k: options[k] for k in extra})
        return ErrorFeedback(inner) if options["error_feedback"] else inner

    def build(options: dict, process_group: Any) -> tuple:
        from .compressors import CompressorState, compressor_hook

        return compressor_hook, CompressorState(compressor(options), process_group, seed=options.get("seed", 0))

    def check(options: dict) -> None:
        compressor(options)  # the compressor's own constructor refuses bad parameters

    return HookEntry(
        name,
        COMPRESSOR,
        summary,
        build=build,
        defaults=defaults,
        check=check,
        run_name=lambda options: compressor(options).name,
        traffic=traffic,
        dashboard_options=lambda: {k: v for k, v in defaults().items() if k != "seed"},
    )


def _make(class_name: str) -> Callable[..., Any]:
    """The compressor class, imported when a run needs it (the registry loads without torch)."""

    def make(**parameters: Any) -> Any:
        from . import compressors

        return getattr(compressors, class_name)(**parameters)

    return make


for _name, _summary, _class, _parameter, _traffic in (
    (
        "topk",
        "the k = ratio x numel largest entries, values and int32 indices",
        "TopK",
        ("ratio", 0.01),
        _gathered_rule(lambda s, o: 8 * _kept(s, o.get("ratio", 0.01))),  # float32 value, int32 index
    ),
    (
        "randomk",
        "k random entries from a seed every rank shares; values only, all-reduced",
        "RandomK",
        ("ratio", 0.01),
        _randomk_traffic,
    ),
    (
        "sign",
        "sign(x) x mean|x|: one bit per entry plus one float (EF-SignSGD with error_feedback)",
        "ScaledSign",
        None,
        _gathered_rule(lambda s, o: math.ceil(numel(s) / 8) + 4),  # 8 signs a byte, a float32 scale per tensor
    ),
    (
        "qsgd",
        "QSGD: norm, sign and a level stochastically rounded to s levels, one byte per entry",
        "QSGD",
        ("levels", 16),
        _gathered_rule(lambda s, o: numel(s) + 4),  # int8 level, a float32 norm
    ),
    (
        "terngrad",
        "TernGrad: max|x| times a random sign in {-1, 0, 1}, one byte per entry",
        "TernGrad",
        None,
        _gathered_rule(lambda s, o: numel(s) + 4),  # int8 in {-1, 0, 1}, a float32 scale
    ),
    (
        "int8",
        "8-bit affine codes with a float32 minimum and step per output channel",
        "Int8PerChannel",
        None,
        _gathered_rule(lambda s, o: numel(s) + 8 * (s[0] if len(s) > 1 else 1)),  # codes, min and step per row
    ),
):
    register(_compressor_entry(_name, _summary, _make(_class), _parameter, _traffic))

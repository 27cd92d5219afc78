"""The lab's compressors (:mod:`.compressors`) as registry records: one family per compressor.

Compressor families take their parameter and ``error_feedback`` as state options; each byte rule
is the compressor's own (``payload_bytes`` and ``payload_dtypes``, beside its code): a summable
payload all-reduced, any other all-gathered, one gather per payload dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .registry import COMPRESSOR, HookEntry, register
from .traffic import Shape, Traffic, allreduced, gathered

__all__: list[str] = []


def _compressor_entry(
    name: str,
    summary: str,
    make: Callable[..., Any],
    parameter: tuple[str, float] | None,
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

    def traffic(shapes: Sequence[Shape], buckets: int, options: dict) -> Traffic:
        """The compressor's own byte rule, per tensor: all-reduced if summable, else all-gathered."""
        sends = compressor(options)
        if sends.summable:
            return allreduced(sum(sends.payload_bytes(s) for s in shapes), buckets)
        return gathered(shapes, sends.payload_bytes, sends.payload_dtypes, buckets)

    return HookEntry(
        name,
        COMPRESSOR,
        summary,
        build=build,
        defaults=defaults,
        check=check,
        run_name=lambda options: compressor(options).name,
        traffic=traffic,
    )


def _make(class_name: str) -> Callable[..., Any]:
    """The compressor class, imported when a run needs it (the registry loads without torch)."""

    def make(**parameters: Any) -> Any:
        from . import compressors

        return getattr(compressors, class_name)(**parameters)

    return make


for _name, _class, _parameter, _summary in (
    ("topk", "TopK", ("ratio", 0.01), "the k = ratio x numel largest entries, values and int32 indices"),
    ("randomk", "RandomK", ("ratio", 0.01), "k random entries from a seed every rank shares; values only, all-reduced"),
    (
        "sign",
        "ScaledSign",
        None,
        "sign(x) x mean|x|: one bit per entry plus one float (EF-SignSGD with error_feedback)",
    ),
    (
        "qsgd",
        "QSGD",
        ("levels", 16),
        "QSGD: norm, sign and a level stochastically rounded to s levels, one byte per entry",
    ),
    ("terngrad", "TernGrad", None, "TernGrad: max|x| times a random sign in {-1, 0, 1}, one byte per entry"),
    ("int8", "Int8PerChannel", None, "8-bit affine codes with a float32 minimum and step per output channel"),
):
    register(_compressor_entry(_name, _summary, _make(_class), _parameter))

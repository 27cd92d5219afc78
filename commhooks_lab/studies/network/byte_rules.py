"""Bytes by rule: what a hook hands to collectives in a step, from parameter shapes and its registry record
(``HookEntry.traffic``), and the tables of those bytes for many models and world sizes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from torch import nn

from ...hooks import registry
from ...hooks.traffic import Shape, allreduced, bucket_count, numel
from ...result import Result
from .alpha_beta import link_bytes

__all__ = [
    "asynchronous",
    "bytes_table",
    "every_h_traffic",
    "parameter_count",
    "parameter_shapes",
    "payload",
    "rule_for",
    "rule_traffic",
    "world_size_sweep",
]


def asynchronous() -> tuple[str, ...]:
    """The hooks that start their collective and return at once, so DDP can overlap them with backward
    (``HookEntry.overlaps_backward``, read when asked: a hook you register counts)."""
    return tuple(e.name for e in registry.entries(registry.HOOK) if e.overlaps_backward)


def rule_traffic(shapes: Sequence[Shape], hook: str, buckets: int | None = None, **options: Any) -> dict:
    """Bytes and collectives one rank hands over in a step where ``hook`` compresses (float32 gradients).

    ``hook`` is a registry name and ``options`` its state options; the rule is the hook's registry
    record's (``HookEntry.traffic``), and ``overlaps_backward`` says whether DDP can hide it behind
    backward. The tests check every rule against the bytes measured on the lab's models; error
    feedback changes no byte.
    """
    entry = registry.get(hook)
    if entry.traffic is None:
        ruled = [e.name for e in registry.entries(registry.HOOK, registry.COMPRESSOR) if e.traffic is not None]
        raise ValueError(f"no byte rule for hook {hook!r} (its registry record has none); rules: {ruled}")
    shapes = [tuple(s) for s in shapes]
    buckets = bucket_count(shapes) if buckets is None else buckets
    return {**entry.traffic(shapes, buckets, options), "overlaps_backward": entry.overlaps_backward}


def every_h_traffic(shapes: Sequence[Shape], every: int, bytes_per_element: int = 4) -> dict:
    """Per step, on average, for a method that all-reduces the whole model in one call every ``every`` steps
    (the lab's local SGD and DiLoCo; ``bytes_per_element=2`` for a 16-bit outer update): that all-reduce's bytes
    and its one call divided by ``every``. Nothing is hidden by overlap: the sync runs after the optimizer step."""
    t = allreduced(bytes_per_element * parameter_count(shapes), 1)
    return {**{k: v / every for k, v in t.items()}, "overlaps_backward": False}


def rule_for(result: Result) -> tuple[str, dict]:
    """The rule (hook name, options) a run's bytes should follow, from its config."""
    hook = result.config["hook"]
    if not isinstance(hook, str) or hook.startswith("compressor:") or ":" in hook:
        raise ValueError(f"{result.name}: give the hook by its registry name to compare it with a byte rule")
    return hook, dict(result.config.get("state_options") or {})


def parameter_shapes(model: nn.Module) -> list[Shape]:
    return [tuple(p.shape) for p in model.parameters() if p.requires_grad]


def parameter_count(shapes: Sequence[Shape]) -> int:
    return sum(numel(s) for s in shapes)


def payload(t: Mapping[str, float]) -> float:
    """Bytes one rank hands to collectives in a step: all-reduced plus all-gathered."""
    return t["allreduce_bytes"] + t["allgather_bytes"]


def bytes_table(
    models: Mapping[str, Sequence[Shape]], hooks: Mapping[str, tuple[str, dict]], world_size: int = 8
) -> pd.DataFrame:
    """For every model and hook: payload and bytes over each rank's link per step, by rule.

    ``hooks``: a label -> (registry name, state options), e.g. ``{"power_sgd r4": ("power_sgd",
    {"matrix_approximation_rank": 4})}``. Ratios compare with the fp32 all-reduce of the same model.
    """
    rows = []
    for model, shapes in models.items():
        fp32 = link_bytes(rule_traffic(shapes, "allreduce"), world_size)
        for label, (hook, options) in hooks.items():
            t = rule_traffic(shapes, hook, **options)
            rows.append(
                {
                    "model": model,
                    "parameters": sum(numel(s) for s in shapes),
                    "hook": label,
                    "payload_bytes": t["allreduce_bytes"] + t["allgather_bytes"],
                    "link_bytes": link_bytes(t, world_size),
                    "link_vs_fp32": link_bytes(t, world_size) / fp32,
                }
            )
    return pd.DataFrame(rows)


def world_size_sweep(
    shapes: Sequence[Shape], hooks: Mapping[str, tuple[str, dict]], world_sizes: Sequence[int]
) -> pd.DataFrame:
    """Bytes over each rank's link per step against world size: all-gathered payloads grow with W."""
    rows = []
    for label, (hook, options) in hooks.items():
        t = rule_traffic(shapes, hook, **options)
        rows += [{"hook": label, "world_size": w, "link_bytes": link_bytes(t, w)} for w in world_sizes]
    return pd.DataFrame(rows)

"""When does compression pay off? Bytes by rule, an alpha-beta network model, and its assumptions.

On loopback compression never speeds a step up (loopback is fast, encoding is not); behind a real
rate-limited link it can, and :mod:`commhooks_lab.studies.links` measures that and holds this model against
it. This module counts bytes (measured on the lab's small models; computed by
the same rules, :func:`rule_traffic`, for real architectures whose shapes :func:`architectures`
builds without downloading anything) and *models* the network, with compression costs passed in
(notebook 8 measures them per element on this CPU).

One module per concern: :mod:`.byte_rules` (bytes by rule and their tables), :mod:`.architectures` (real models'
shapes on the meta device), :mod:`.alpha_beta` (the network model and its break-even bandwidth),
:mod:`.compression_cost` (the registered compressors' local work, timed here) and :mod:`.headroom`. Every name is
reachable here as before (``lab.network.NAME``).
"""

from __future__ import annotations

from typing import Any

from ...hooks.traffic import bucket_count
from .alpha_beta import (
    ASSUMPTIONS,
    TwoLevelNetwork,
    break_even,
    comm_seconds,
    link_bytes,
    network_model,
    traffic,
    two_level_hops,
    two_level_rule,
    two_level_seconds,
    two_level_traffic,
)
from .architectures import ARCHITECTURES, architectures
from .byte_rules import (
    asynchronous,
    bytes_table,
    every_h_traffic,
    parameter_count,
    parameter_shapes,
    payload,
    rule_for,
    rule_traffic,
    world_size_sweep,
)
from .compression_cost import compression_cost_per_element
from .headroom import headroom

__all__ = [
    "architectures",
    "ARCHITECTURES",
    "ASSUMPTIONS",
    "break_even",
    "bucket_count",
    "bytes_table",
    "comm_seconds",
    "compression_cost_per_element",
    "every_h_traffic",
    "headroom",
    "link_bytes",
    "network_model",
    "parameter_count",
    "parameter_shapes",
    "payload",
    "rule_for",
    "rule_traffic",
    "traffic",
    "two_level_rule",
    "two_level_seconds",
    "two_level_hops",
    "two_level_traffic",
    "TwoLevelNetwork",
    "world_size_sweep",
]


def __getattr__(name: str) -> Any:
    """``ASYNCHRONOUS``: the hooks DDP can overlap with backward (:func:`.byte_rules.asynchronous`), read when asked."""
    if name == "ASYNCHRONOUS":
        return asynchronous()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

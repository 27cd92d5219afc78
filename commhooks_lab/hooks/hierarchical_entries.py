"""The hierarchical hooks (:mod:`.hierarchical`) as registry records: one per inter-node leg.

``hierarchical`` (float32 between nodes), ``hierarchical_fp16``, ``hierarchical_power_sgd`` and
``hierarchical_topk`` (top-k with error feedback by default). Each takes ``ranks_per_node`` (0: the node size the
ranks were started with, ``LOCAL_WORLD_SIZE``) and its leg's own options, checked by the flat hook's own rules.

No byte rule (``traffic``): the network model's rules are one flat ring over W ranks, and these hooks send on two
levels. :func:`commhooks_lab.studies.network.alpha_beta.two_level_seconds` models them; the probe's ``intra_bytes``
and ``inter_bytes`` count them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _compat
from .powersgd import SHORT_RUN_START
from .registry import HOOK, HookEntry, check_options, get, register

__all__ = ["FLAT_LEG"]

#: Each hierarchical hook's inter-node leg as the flat hook that sends the same payload: its byte rule is the leg's.
FLAT_LEG = {
    "hierarchical": "allreduce",
    "hierarchical_fp16": "fp16",
    "hierarchical_power_sgd": "power_sgd",
    "hierarchical_topk": "topk",
}

_NEEDS_BUCKETS = (
    "a hierarchical hook sums whole buckets node by node (and its PowerSGD and top-k legs key their memory by "
    "bucket), and under compiled autograd DDP passes one (param.grad, param) at a time"
)


def _check_node_size(options: dict) -> None:
    size = options.get("ranks_per_node", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(
            f"ranks_per_node must be an int >= 0 (0: LOCAL_WORLD_SIZE, the node size the ranks were started with), "
            f"got {size!r}"
        )


def _check(leg: str) -> Callable[[dict], None]:
    def check(options: dict) -> None:
        _check_node_size(options)
        rest = {k: v for k, v in options.items() if k != "ranks_per_node"}
        if leg == "power_sgd":
            check_options(get("power_sgd"), rest)  # flat PowerSGD's record: its names, types and rules
        elif leg == "topk":
            from .compressors import TopK

            TopK(rest.get("ratio", 0.01))  # TopK's own constructor refuses a bad ratio

    return check


def _defaults(leg: str) -> Callable[[], dict]:
    def defaults() -> dict:
        own: dict[str, Any] = {}
        if leg == "power_sgd":
            own = _compat.power_sgd_defaults()
        elif leg == "topk":
            own = {"ratio": 0.01, "error_feedback": True, "seed": 0}
        return {"ranks_per_node": 0, **own}

    return defaults


def _run_name(name: str, leg: str) -> Callable[[dict], str]:
    def run_name(options: dict) -> str:
        text = name
        if leg == "power_sgd":
            text += f" r{options.get('matrix_approximation_rank', 1)}"
        elif leg == "topk":
            text += f" {options.get('ratio', 0.01):.0%}" + (" + EF" if options.get("error_feedback", True) else "")
        if options.get("ranks_per_node"):
            text += f" ({options['ranks_per_node']} per node)"
        return text

    return run_name


def _build(leg: str) -> Callable[[dict, Any], tuple]:
    def build(options: dict, process_group: Any) -> tuple:
        from . import hierarchical

        return hierarchical.hierarchical_hook, hierarchical.make_state(leg, options, process_group)

    return build


for _name, _leg, _summary in (
    ("hierarchical", "float32", "sum inside each node, all-reduce float32 between node leaders, broadcast inside"),
    ("hierarchical_fp16", "fp16", "sum inside each node, float16 between node leaders only, broadcast inside"),
    ("hierarchical_power_sgd", "power_sgd", "sum inside each node, PowerSGD between node leaders only"),
    ("hierarchical_topk", "topk", "sum inside each node, top-k with error feedback between node leaders only"),
):
    register(
        HookEntry(
            _name,
            HOOK,
            _summary,
            build=_build(_leg),
            defaults=_defaults(_leg),
            check=_check(_leg),
            run_name=_run_name(_name, _leg),
            not_compilable=_NEEDS_BUCKETS,
            short_run=(lambda: {"start_powerSGD_iter": SHORT_RUN_START}) if _leg == "power_sgd" else dict,
        )
    )

"""The alpha-beta network model: a step's gradient time from bytes, ring steps, latency, bandwidth, overlap and
compression work, and the bandwidth below which a hook beats a baseline (see ``ASSUMPTIONS``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from ...hooks import registry
from ...result import Result

__all__ = [
    "ASSUMPTIONS",
    "break_even",
    "comm_seconds",
    "link_bytes",
    "network_model",
    "traffic",
    "two_level_rule",
    "two_level_seconds",
    "two_level_hops",
    "two_level_traffic",
    "TwoLevelNetwork",
]

ASSUMPTIONS = (
    "time a step spends on gradients = compression work + latency x ring steps + bytes over each rank's link / "
    "bandwidth (the alpha-beta model); forward, backward and optimizer time are the same for every hook and left out",
    "bytes = the payload each rank hands to collectives (measured on the lab's models, by rule for real ones); a ring "
    "all-reduce moves 2(W-1)/W of it over each link in 2(W-1) latency steps, a ring all-gather (W-1) times it in "
    "W-1 steps",
    "overlap: DDP starts each bucket's all-reduce during backward, so part of its time is hidden; the lab's "
    "compressing hooks wait for their collectives, so theirs is not. With overlap=0 the model hides nothing for "
    "anyone, which favours compression; overlap=f hides a fraction f of the communication of PyTorch's all-reduce "
    "and 16-bit hooks (ASYNCHRONOUS); PowerSGD, which chains its collectives and computes between them, is "
    "charged in full",
    "compression work = cost per element x elements, with the costs passed in (measured on this CPU in notebook 8: "
    "a GPU's are far lower; where the compression cost sets the break-even bandwidth it rises in proportion, "
    "where latency matters too (PowerSGD's three all-reduces per bucket) it rises less)",
)


def traffic(result: Result) -> dict:
    """Mean per-step bytes and calls, measured, over the steps where the hook compressed; whether it
    overlaps backward comes from its registry record (a hook the registry does not name: it does not)."""
    s = result.compressed_steps()
    gather_bytes = s["allgather_bytes"].mean()
    gather_calls = s["allgather_calls"].mean()
    hook = result.config.get("hook")
    names = registry.hook_names()
    return {
        "allreduce_bytes": s["payload_bytes"].mean() - gather_bytes,
        "allgather_bytes": gather_bytes,
        "allreduce_calls": s["collective_calls"].mean() - gather_calls,
        "allgather_calls": gather_calls,
        "overlaps_backward": hook in names and registry.get(hook).overlaps_backward,
    }


def link_bytes(t: Mapping[str, float], world_size: int) -> float:
    """Bytes over each rank's link with ring algorithms: 2(W-1)/W x all-reduced, (W-1) x all-gathered."""
    w = world_size
    return 2 * (w - 1) / w * t["allreduce_bytes"] + (w - 1) * t["allgather_bytes"]


def _ring_steps(t: Mapping[str, float], world_size: int) -> float:
    """Sequential latency hops: 2(W-1) per ring all-reduce, W-1 per ring all-gather."""
    w = world_size
    return 2 * (w - 1) * t["allreduce_calls"] + (w - 1) * t["allgather_calls"]


def comm_seconds(t: Mapping[str, float], world_size: int, bandwidth_gbps: float, latency_us: float) -> float:
    return _ring_steps(t, world_size) * latency_us * 1e-6 + link_bytes(t, world_size) * 8 / (bandwidth_gbps * 1e9)


def _hidden(t: Mapping[str, float], overlap: float) -> float:
    """The share of a hook's communication that backward hides: ``overlap`` if it overlaps at all."""
    return overlap if t.get("overlaps_backward") else 0.0


def network_model(
    traffics: Mapping[str, Mapping[str, float]],
    compress_s: Mapping[str, float] | None = None,
    bandwidths_gbps: Sequence[float] = (1, 10, 100),
    world_sizes: Sequence[int] = (2, 8, 64),
    latency_us: float = 5.0,
    overlap: float = 0.0,
    baseline: str = "allreduce",
) -> pd.DataFrame:
    """Modelled gradient time per step for every hook, bandwidth and world size (see ``ASSUMPTIONS``).

    ``traffics``: hook name -> :func:`traffic` or :func:`rule_traffic`; ``compress_s``: hook name ->
    seconds of compression work per step (0 if missing).
    """
    if baseline not in traffics:
        raise ValueError(f"the network model compares with {baseline!r}: include it among the traffics")
    compress_s = compress_s or {}
    rows = []
    for name, t in traffics.items():
        for w in world_sizes:
            for bw in bandwidths_gbps:
                comm = comm_seconds(t, w, bw, latency_us) * (1.0 - _hidden(t, overlap))
                work = compress_s.get(name, 0.0)
                rows.append(
                    {
                        "hook": name,
                        "world_size": w,
                        "bandwidth_gbps": bw,
                        "overlap": _hidden(t, overlap),
                        "compress_ms": work * 1e3,
                        "comm_ms": comm * 1e3,
                        "step_ms": (work + comm) * 1e3,
                    }
                )
    table = pd.DataFrame(rows)
    base = table[table["hook"] == baseline].set_index(["world_size", "bandwidth_gbps"])["step_ms"]
    table[f"speedup_vs_{baseline}"] = [
        base[(w, bw)] / ms for w, bw, ms in zip(table["world_size"], table["bandwidth_gbps"], table["step_ms"])
    ]
    return table


def break_even(
    traffics: Mapping[str, Mapping[str, float]],
    compress_s: Mapping[str, float] | None = None,
    world_size: int = 8,
    latency_us: float = 5.0,
    overlap: float = 0.0,
    baseline: str = "allreduce",
) -> pd.DataFrame:
    """The bandwidth below which each hook's gradient time beats the baseline's: where they are equal.

    o_h + e_h (a n_h + b_h / bw) = o_0 + e_0 (a n_0 + b_0 / bw)
    =>  bw = (e_0 b_0 - e_h b_h) / (o_h - o_0 + a (e_h n_h - e_0 n_0))
    with o the compression work, e the exposed share (overlap), a the latency, n ring steps and b bits over a link.
    """
    compress_s = compress_s or {}
    ref = traffics[baseline]
    e0, o0 = 1.0 - _hidden(ref, overlap), compress_s.get(baseline, 0.0)
    a = latency_us * 1e-6
    rows = []
    for name, t in traffics.items():
        if name == baseline:
            continue
        eh, oh = 1.0 - _hidden(t, overlap), compress_s.get(name, 0.0)
        bits_saved = 8 * (e0 * link_bytes(ref, world_size) - eh * link_bytes(t, world_size))
        cost = oh - o0 + a * (eh * _ring_steps(t, world_size) - e0 * _ring_steps(ref, world_size))
        if bits_saved <= 0:
            verdict, gbps = "never (as many unhidden bytes or more)", math.nan
        elif cost <= 0:
            verdict, gbps = "always", math.inf
        else:
            gbps = bits_saved / cost / 1e9
            verdict = f"below {gbps:.3g} Gbit/s"
        rows.append(
            {
                "hook": name,
                "world_size": world_size,
                "link_bytes_vs_baseline": link_bytes(t, world_size) / link_bytes(ref, world_size),
                "compress_ms": oh * 1e3,
                "break_even_gbps": gbps,
                "pays_off": verdict,
            }
        )
    return pd.DataFrame(rows)


# -- two levels: nodes of ranks on a fast switch, one uplink per node -------------------------------------------------


@dataclass(frozen=True)
class TwoLevelNetwork:
    """Latency per hop (us) and payload bandwidth (Gbit/s) inside a node and between nodes, and the shape."""

    intra_alpha_us: float
    intra_gbps: float
    inter_alpha_us: float
    inter_gbps: float
    nodes: int
    ranks_per_node: int


def two_level_traffic(result: Result, hierarchical: bool, skip: int | None = None) -> dict:
    """Rank 0's mean bytes and collectives per step, by level (the probe's ``intra_bytes`` and ``inter_bytes``),
    over the steps after ``skip`` (None: the steps where the hook compressed; a hierarchical hook sends more than
    the bucket on rank 0, so its steps never read as compressing: give ``skip``).

    A flat hook issues every collective on the world; a hierarchical one two per bucket inside the node (a reduce
    and a broadcast) and the rest between the node leaders (rank 0 is one), all-gathers among them.
    """
    s = result.compressed_steps() if skip is None else result.steps.iloc[skip:]
    intra_calls = 2 * s["buckets"].mean() if hierarchical else 0.0
    gathers = s["allgather_calls"].mean()
    return {
        "intra_bytes": s["intra_bytes"].mean(),
        "inter_bytes": s["inter_bytes"].mean(),
        "intra_calls": intra_calls,
        "inter_allreduce_calls": s["collective_calls"].mean() - intra_calls - gathers,
        "inter_allgather_calls": gathers,
        "hierarchical": hierarchical,
    }


def two_level_rule(
    shapes: Sequence[tuple[int, ...]],
    hook: str,
    options: Mapping | None = None,
    nodes: int = 2,
    ranks_per_node: int = 2,
    buckets: int | None = None,
) -> dict:
    """:func:`two_level_traffic`'s numbers from parameter shapes alone, for ``nodes`` >= 2 (a real cluster's too).

    A flat hook's ring bytes over the W ranks, all between nodes; a hierarchical hook's leg by the byte rule of the
    flat hook that sends its payload (``FLAT_LEG``) over the N leaders, and inside the node the leader's reduce
    ((L-1)/L of the float32 bucket) and broadcast (all of it).
    """
    from ...hooks.hierarchical_entries import FLAT_LEG
    from ...hooks.traffic import bucket_count, numel

    buckets = bucket_count(shapes) if buckets is None else buckets
    hierarchical = hook in FLAT_LEG
    flat = registry.get(FLAT_LEG.get(hook, hook))
    if flat.traffic is None:
        raise ValueError(f"{flat.name} has no byte rule, so the model cannot count {hook}'s bytes")
    leg = flat.traffic(shapes, buckets, {k: v for k, v in (options or {}).items() if k != "ranks_per_node"})
    group = nodes if hierarchical else nodes * ranks_per_node
    inside = hierarchical and ranks_per_node > 1
    bucket = 4 * sum(numel(s) for s in shapes)
    return {
        "intra_bytes": (2 - 1 / ranks_per_node) * bucket if inside else 0.0,
        "inter_bytes": link_bytes(leg, group),
        "intra_calls": 2.0 * buckets if inside else 0.0,
        "inter_allreduce_calls": leg["allreduce_calls"],
        "inter_allgather_calls": leg["allgather_calls"],
        "hierarchical": hierarchical,
    }


def two_level_hops(t: Mapping, net: TwoLevelNetwork) -> tuple[float, float]:
    """(hops between nodes, hops inside a node) of a step: the probe's counts where ``t`` has them
    (``inter_hops``, ``intra_hops``: any hook, a learner's own hierarchy included), else from its calls, as
    :func:`two_level_traffic` and :func:`two_level_rule` give them for flat and the lab's hierarchical hooks."""
    if "inter_hops" in t:
        return t["inter_hops"], t["intra_hops"]
    group = net.nodes if t["hierarchical"] else net.nodes * net.ranks_per_node
    inter = 2 * (group - 1) * t["inter_allreduce_calls"] + (group - 1) * t["inter_allgather_calls"]
    return inter, t["intra_calls"] * (net.ranks_per_node - 1)


def two_level_seconds(t: Mapping, net: TwoLevelNetwork) -> float:
    """A step's communication on two levels: hops x alpha + bytes over the busiest link / bandwidth, per level.

    Flat (ring over all W ranks, consecutive ranks on a node): each of a ring's 2(W-1) steps (W-1 for an all-gather)
    has one hop per node across its uplink, and the steps wait for their slowest hop, so the whole collective runs at
    the uplink's alpha and rate, with one rank's ring bytes (``inter_bytes``) through each uplink; its hops inside a
    node run beside the crossing ones and cost nothing more. Hierarchical: the node's reduce and broadcast (L-1 hops
    each, the leader's ``intra_bytes`` at the intra rate), then the leaders' leg, a ring over the N leaders
    (2(N-1) hops per all-reduce, N-1 per all-gather) with ``inter_bytes`` through the uplink, one after the other.
    """
    inter, intra = two_level_hops(t, net)
    seconds = inter * net.inter_alpha_us * 1e-6 + t["inter_bytes"] * 8 / (net.inter_gbps * 1e9)
    return seconds + intra * net.intra_alpha_us * 1e-6 + t["intra_bytes"] * 8 / (net.intra_gbps * 1e9)

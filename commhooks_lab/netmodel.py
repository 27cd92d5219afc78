"""When does compression pay off? An alpha-beta network model fed with measured numbers.

On one machine compression never speeds a step up (loopback is fast, encoding is not), so the
lab does not fake a speed-up: it measures bytes and local times, then *models* the network.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

import pandas as pd

from .result import Result

ASSUMPTIONS = (
    "step time = compute + compression overhead + latency x ring steps + bytes over the busiest link / bandwidth "
    "(the alpha-beta model)",
    "compute = median step time of the noop hook (forward, backward, optimizer; nothing sent), measured here",
    "compression overhead = median step time of the hook minus that of allreduce, both measured here on loopback, "
    "where their local communication roughly cancels; floored at 0",
    "bytes = the payload each rank handed to collectives, measured; a ring all-reduce moves 2(W-1)/W of it over "
    "each link in 2(W-1) latency steps, a ring all-gather (W-1) times it in W-1 steps",
    "no overlap of communication with backward (DDP overlaps buckets; the model is equally pessimistic for every hook)",
    "compute and overhead are this machine's CPU times; on GPUs both shrink, which moves break-even bandwidths up",
)


def _overhead(result: Result, allreduce: Result) -> float:
    """Seconds of local compression work per step beyond plain allreduce (see ASSUMPTIONS)."""
    return max(0.0, _median_step(result) - _median_step(allreduce))


def _median_step(result: Result) -> float:
    return statistics.median(result.compressed_steps()["step_time_s"])


def traffic(result: Result) -> dict:
    """Mean per-step bytes and calls over the steps where the hook compressed."""
    s = result.compressed_steps()
    gather_bytes = s["allgather_bytes"].mean()
    gather_calls = s["allgather_calls"].mean()
    return {
        "allreduce_bytes": s["payload_bytes"].mean() - gather_bytes,
        "allgather_bytes": gather_bytes,
        "allreduce_calls": s["collective_calls"].mean() - gather_calls,
        "allgather_calls": gather_calls,
    }


def link_bytes(t: dict, world_size: int) -> float:
    """Bytes over each rank's busiest link with ring algorithms."""
    w = world_size
    return 2 * (w - 1) / w * t["allreduce_bytes"] + (w - 1) * t["allgather_bytes"]


def ring_steps(t: dict, world_size: int) -> float:
    """Sequential latency hops: 2(W-1) per ring all-reduce, W-1 per ring all-gather."""
    w = world_size
    return 2 * (w - 1) * t["allreduce_calls"] + (w - 1) * t["allgather_calls"]


def comm_seconds(t: dict, world_size: int, bandwidth_gbps: float, latency_us: float) -> float:
    return ring_steps(t, world_size) * latency_us * 1e-6 + link_bytes(t, world_size) * 8 / (bandwidth_gbps * 1e9)


def _by_name(results: Iterable[Result]) -> dict[str, Result]:
    by_name = {r.name: r for r in results}
    for needed in ("allreduce", "noop"):
        if needed not in by_name:
            raise ValueError(
                f"the network model needs a run of '{needed}' among the results (it is the "
                f"{'baseline' if needed == 'allreduce' else 'compute-only reference'})"
            )
    return by_name


def network_model(
    results: Iterable[Result],
    bandwidths_gbps: Sequence[float] = (1, 10, 100),
    world_sizes: Sequence[int] = (2, 8, 64),
    latency_us: float = 5.0,
) -> pd.DataFrame:
    """Modelled time per step for every hook, bandwidth and world size (see ``ASSUMPTIONS``)."""
    runs = _by_name(results)
    compute = _median_step(runs["noop"])
    rows = []
    for name, result in runs.items():
        if name == "noop":
            continue
        overhead = _overhead(result, runs["allreduce"])
        t = traffic(result)
        for w in world_sizes:
            for bw in bandwidths_gbps:
                comm = comm_seconds(t, w, bw, latency_us)
                rows.append(
                    {
                        "hook": name,
                        "world_size": w,
                        "bandwidth_gbps": bw,
                        "compute_ms": compute * 1e3,
                        "overhead_ms": overhead * 1e3,
                        "comm_ms": comm * 1e3,
                        "step_ms": (compute + overhead + comm) * 1e3,
                    }
                )
    table = pd.DataFrame(rows)
    base = table[table["hook"] == "allreduce"].set_index(["world_size", "bandwidth_gbps"])["step_ms"]
    table["speedup_vs_allreduce"] = [
        base[(w, bw)] / ms for w, bw, ms in zip(table["world_size"], table["bandwidth_gbps"], table["step_ms"])
    ]
    return table


def break_even(results: Iterable[Result], world_size: int = 8, latency_us: float = 5.0) -> pd.DataFrame:
    """The bandwidth below which each hook beats allreduce: step times equal there.

    o_h + a n_h + b_h / bw = o_ar + a n_ar + b_ar / bw  =>  bw = (b_ar - b_h) / (o_h - o_ar + a (n_h - n_ar))
    with o the compression overhead, a the latency, n ring steps and b bits over the link.
    """
    runs = _by_name(results)
    ref = traffic(runs["allreduce"])
    rows = []
    for name, result in runs.items():
        if name in ("allreduce", "noop"):
            continue
        t = traffic(result)
        overhead = _overhead(result, runs["allreduce"])
        bits_saved = 8 * (link_bytes(ref, world_size) - link_bytes(t, world_size))
        cost = overhead + (ring_steps(t, world_size) - ring_steps(ref, world_size)) * latency_us * 1e-6
        if bits_saved <= 0:
            verdict, gbps = "never (sends no fewer bytes)", float("nan")
        elif cost <= 0:
            verdict, gbps = "always", float("inf")
        else:
            gbps = bits_saved / cost / 1e9
            verdict = f"below {gbps:.3g} Gbit/s"
        rows.append(
            {
                "hook": name,
                "world_size": world_size,
                "bytes_vs_allreduce": (t["allreduce_bytes"] + t["allgather_bytes"])
                / (ref["allreduce_bytes"] + ref["allgather_bytes"]),
                "overhead_ms": overhead * 1e3,
                "break_even_gbps": gbps,
                "pays_off": verdict,
            }
        )
    return pd.DataFrame(rows)

"""Nodes on a laptop: flat against hierarchical communication on one Cluster of nodes behind slow uplinks.

:func:`time_on_nodes` starts one Cluster of ``nodes`` x ``ranks_per_node`` ranks behind ``link`` uplinks
(``lab.Cluster(..., nodes=, link=)``) and on it:

1. measures each link class from the ranks (:func:`measure_levels`): a large send inside a node and one between
   nodes (payload rates), a 4-byte all-reduce inside a node and between the node leaders (alphas per hop);
2. times every DDP hook and every FSDP2 communication in timing mode (DDP's own step, no probe waits), with each
   run's bytes inside and between nodes and the share of TCP segments its ranks retransmitted.

:func:`hidden_shares` measures how much of a hook's communication backward hid, behind a link of its own
(:func:`commhooks_lab.studies.overlap.overlap_spread`). Both record their runs for machines that cannot build
links and replay them there, as :mod:`.links` does (:mod:`.recorded`). :func:`model_table` holds the two-level
alpha-beta model (:mod:`.network`) against the measured step times.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping

import pandas as pd

from ..engine.config import ExperimentConfig
from ..experiment import compare
from ..launcher import Cluster, Ranks
from ..launcher.link_spec import as_link, payload_share
from . import network, recorded
from .links import BASE, WARMUP_STEPS, step_statistics

__all__ = [
    "collective_model_ms",
    "hidden_shares",
    "measure_levels",
    "model_table",
    "NodeTimes",
    "SIZES",
    "tcp_segments",
    "time_on_nodes",
]


#: The sizes of the all-reduces :func:`measure_levels` times on each group (floats): the model's alpha (4 bytes),
#: then the size of PowerSGD's factors and of a small bucket.
SIZES = (1, 256, 4096)


def _levels_job(ctx, ranks_per_node: int, intra_floats: int, inter_floats: int, repeats: int) -> dict:
    """Rank 1 times a send from rank 0 inside the node (from a barrier), the leaders an all-reduce of
    ``inter_floats`` between them (median of ``repeats`` each); every rank times all-reduces of each of
    :data:`SIZES` in its node group, the world's and the leaders' (20 each: the fastest 4-byte one is alpha, the
    median of each size its time)."""
    import torch
    import torch.distributed as dist

    world, rank, size = ctx.world_size, ctx.rank, ranks_per_node
    nodes = [list(range(s, s + size)) for s in range(0, world, size)]
    node_group, _ = dist.new_subgroups_by_enumeration(nodes)
    leaders, _ = dist.new_subgroups_by_enumeration([[n[0] for n in nodes]])
    tiny = torch.ones(1)

    def small(group, x=tiny) -> list[float]:
        for _ in range(3):
            dist.all_reduce(x, group=group)
        times = []
        for _ in range(20):
            dist.barrier(group=group)
            start = time.perf_counter()
            dist.all_reduce(x, group=group)
            times.append(time.perf_counter() - start)
        return times

    # alpha is the fastest 4-byte all-reduce: the link's own latency, to which load only adds (from the median, a
    # busy CI's alpha grew until 1 KB looked as fast as the model); the sizes' times are medians, what a step pays
    out: dict = {"intra_small_s": min(small(node_group))}
    if leaders is not None:
        out["inter_small_s"] = min(small(leaders))
    for floats in SIZES:
        x = torch.ones(floats)
        out[f"node {floats}"] = statistics.median(small(node_group, x))
        out[f"world {floats}"] = statistics.median(small(None, x))
        if leaders is not None:
            out[f"leaders {floats}"] = statistics.median(small(leaders, x))
    x = torch.ones(intra_floats)
    seconds = []
    for _ in range(repeats):  # inside a node: rank 0 sends to rank 1, timed by the receiver from a barrier
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            dist.send(x, 1)
        elif rank == 1:
            dist.recv(x, 0)
            seconds.append(time.perf_counter() - start)
    if rank == 1:
        out["intra_s"] = statistics.median(seconds)
    if leaders is not None:  # between nodes: the leaders' all-reduce, which ends only once both have sent
        x = torch.ones(inter_floats)
        dist.all_reduce(x, group=leaders)
        seconds = []
        for _ in range(repeats):
            dist.barrier(group=leaders)
            start = time.perf_counter()
            dist.all_reduce(x, group=leaders)
            seconds.append(time.perf_counter() - start)
        out["inter_s"] = statistics.median(seconds)
    dist.barrier()
    return out


def measure_levels(
    cluster: Cluster, link: str, nodes: int, ranks_per_node: int
) -> tuple[network.TwoLevelNetwork, pd.DataFrame]:
    """The two-level network these ranks sit on, measured: payload rates and alphas per link class; and the time
    of an all-reduce of each of :data:`SIZES` on a node's ranks, the leaders and the world, beside the model's
    time for it from that network (:func:`collective_model_ms`)."""
    parsed = as_link(link)
    if parsed is None or parsed.rate_bits is None:
        raise ValueError(f"nodes are measured behind a rate-limited uplink, not link={link!r}")
    inter_floats = max(1 << 14, int(parsed.rate_bits * payload_share() * 0.3 / 32))  # about 0.3 s at the set rate
    intra_floats = 1 << 22  # 16 MB: tens of ms at loopback speed
    rows = cluster.run(_levels_job, ranks_per_node, intra_floats, inter_floats, 3)
    intra_s, inter_s = rows[1]["intra_s"], rows[0]["inter_s"]
    ring = 2 * (nodes - 1) / nodes  # what each leader sends through its uplink, per byte of the all-reduce
    net = network.TwoLevelNetwork(
        intra_alpha_us=1e6 * rows[0]["intra_small_s"] / (2 * (ranks_per_node - 1)),
        intra_gbps=32 * intra_floats / intra_s / 1e9,
        inter_alpha_us=1e6 * rows[0]["inter_small_s"] / (2 * (nodes - 1)),
        inter_gbps=32 * ring * inter_floats / inter_s / 1e9,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
    )
    sizes = [
        {"group": group, "bytes": 4 * floats, "measured_ms": 1e3 * rows[0][f"{group} {floats}"],
         "model_ms": collective_model_ms(net, group, 4 * floats)}
        for group in ("node", "leaders", "world")
        for floats in SIZES
    ]  # fmt: skip
    return net, pd.DataFrame(sizes)


def collective_model_ms(net: network.TwoLevelNetwork, group: str, nbytes: int) -> float:
    """The model's time (ms) for one all-reduce of ``nbytes`` on a node's ranks, the leaders, or the world."""
    size = {"node": net.ranks_per_node, "leaders": net.nodes, "world": net.nodes * net.ranks_per_node}[group]
    hops, ring = 2 * (size - 1), 2 * (size - 1) / size * nbytes
    if group == "node":
        return 1e3 * (hops * net.intra_alpha_us * 1e-6 + ring * 8 / (net.intra_gbps * 1e9))
    return 1e3 * (hops * net.inter_alpha_us * 1e-6 + ring * 8 / (net.inter_gbps * 1e9))


def _to_json(frame: pd.DataFrame) -> dict:
    """A table as JSON keeps it (columns and rows), for a recording."""
    return frame.to_dict(orient="split", index=False)


def _from_json(data: dict) -> pd.DataFrame:
    return pd.DataFrame(data["data"], columns=data["columns"])


def tcp_segments(ctx) -> tuple[int, int]:
    """TCP segments this rank's network namespace has retransmitted and sent (``/proc/net/snmp``: per namespace)."""
    with open("/proc/net/snmp") as f:
        names, values = [line.split()[1:] for line in f if line.startswith("Tcp:")]
    tcp = dict(zip(names, map(int, values)))
    return tcp["RetransSegs"], tcp["OutSegs"]


@dataclasses.dataclass
class NodeTimes:
    """What :func:`time_on_nodes` measured: the two-level network, one row per run (step time, bytes by level,
    retransmitted share), each DDP hook's bytes and collectives per step by level (for the model), and all-reduces
    of a few sizes on each group, measured and modelled (:func:`measure_levels`)."""

    network: network.TwoLevelNetwork
    link: str
    times: pd.DataFrame
    traffics: dict[str, dict]
    collectives: pd.DataFrame

    def to_json(self) -> dict:
        return {
            "network": dataclasses.asdict(self.network),
            "link": self.link,
            "times": _to_json(self.times),
            "traffics": self.traffics,
            "collectives": _to_json(self.collectives),
        }

    @classmethod
    def from_json(cls, data: dict) -> NodeTimes:
        net = network.TwoLevelNetwork(**data["network"])
        collectives = _from_json(data["collectives"])
        return cls(net, data["link"], _from_json(data["times"]), data["traffics"], collectives)


def time_on_nodes(
    hooks: Mapping[str, str],
    fsdp2: Mapping[str, str | None] | None = None,
    link: str = "10mbit",
    nodes: int = 2,
    ranks_per_node: int = 2,
    model: str = "mlp",
    steps: int = 8,
    hierarchical: tuple[str, ...] = ("hierarchical", "hierarchical_fp16", "hierarchical_power_sgd"),
) -> NodeTimes:
    """Every hook (label -> DDP hook spec) and FSDP2 communication (label -> ``fsdp2_comm``) on one Cluster of
    ``nodes`` x ``ranks_per_node`` ranks behind ``link`` uplinks, ``steps`` steps each in timing mode, the first
    ``WARMUP_STEPS`` left out; ``noop`` first (the step with no communication: the model's base).

    A hook is hierarchical when its spec starts with a name in ``hierarchical``. Where this machine cannot build
    links: the run of this same call recorded on one that could (:func:`.recorded.replay`, which says so).
    """
    as_link(link)
    fsdp2 = dict(fsdp2 or {})
    hooks = {BASE: BASE, **hooks}
    arguments = dict(hooks=hooks, fsdp2=fsdp2, link=link, nodes=nodes, ranks_per_node=ranks_per_node, model=model,
                     steps=steps)  # fmt: skip
    if recorded.why_replayed() is not None:
        return NodeTimes.from_json(recorded.replay("time_on_nodes", arguments, f"nodes={nodes}, link={link!r}"))
    world = nodes * ranks_per_node
    base = ExperimentConfig(model=model, world_size=world, nodes=nodes, link=link, steps=steps, timing=True,
                            measure=False)  # fmt: skip
    configs = [(label, False, base.replace(hook=spec, label=label)) for label, spec in hooks.items()]
    fsdp2_base = base.replace(api="fsdp2", timing=False)  # timing mode is DDP's: FSDP2 runs under the lab's measures
    configs += [(label, True, fsdp2_base.replace(fsdp2_comm=comm, label=label)) for label, comm in fsdp2.items()]
    rows, traffics = [], {}
    with Ranks(fresh=True) as ranks:
        cluster = ranks(base.rank_spec())
        net, collectives = measure_levels(cluster, link, nodes, ranks_per_node)
        for label, is_fsdp2, config in configs:
            before = cluster.run(tcp_segments)
            (result,) = compare([config], cluster=cluster)
            after = cluster.run(tcp_segments)
            sent = sum(a[1] - b[1] for a, b in zip(after, before))
            resent = sum(a[0] - b[0] for a, b in zip(after, before))
            kept = result.steps.iloc[WARMUP_STEPS:]
            spec = "" if is_fsdp2 else str(hooks[label])
            tiered = spec.split("[")[0] in hierarchical
            rows.append({
                "run": label, "api": "fsdp2" if is_fsdp2 else "ddp", "hierarchical": tiered,
                "intra_bytes": float(kept["intra_bytes"].mean()), "inter_bytes": float(kept["inter_bytes"].mean()),
                **step_statistics(result), "retransmitted": resent / max(sent, 1),
            })  # fmt: skip
            if not is_fsdp2:
                traffics[label] = network.two_level_traffic(result, tiered, skip=WARMUP_STEPS)
    timed = NodeTimes(net, link, pd.DataFrame(rows), traffics, collectives)
    recorded.keep("time_on_nodes", arguments, timed.to_json())
    return timed


def model_table(timed: NodeTimes, costs: Mapping[str, float]) -> pd.DataFrame:
    """The DDP rows against the two-level alpha-beta model: ``noop``'s measured step + the hook's own work
    (``costs``, seconds: e.g. :func:`.links.local_costs`) + its communication by
    :func:`commhooks_lab.studies.network.two_level_seconds`, from its bytes and hops and the measured network."""
    times = timed.times.set_index("run")
    base_ms = times.loc[BASE, "median_ms"]
    rows = []
    for label, t in timed.traffics.items():
        if label == BASE:
            continue
        comm_ms = 1e3 * network.two_level_seconds(t, timed.network)
        model_ms = base_ms + 1e3 * costs.get(label, 0.0) + comm_ms
        row = times.loc[label]
        rows.append({
            "run": label, "measured_ms": row["median_ms"], "min_ms": row["min_ms"], "max_ms": row["max_ms"],
            "model_ms": model_ms, "comm_ms": comm_ms, "measured_vs_model": row["median_ms"] / model_ms,
            "retransmitted": row["retransmitted"],
        })  # fmt: skip
    return pd.DataFrame(rows).set_index("run")


def hidden_shares(hooks: Mapping[str, Callable], link: str = "100mbit", repeats: int = 5) -> pd.DataFrame:
    """:func:`commhooks_lab.studies.overlap.overlap_spread` on two ranks behind ``link`` (hooks: label -> hook
    function), recorded and replayed as :func:`time_on_nodes` is (the recording knows the hooks by their labels)."""
    from .overlap import overlap_spread

    as_link(link)
    arguments = dict(hooks=list(hooks), link=link, repeats=repeats)
    if recorded.why_replayed() is not None:
        data = recorded.replay("hidden_shares", arguments, f"link={link!r}")
        return _from_json(data).set_index("hook")
    table = overlap_spread(dict(hooks), link=link, repeats=repeats)
    recorded.keep("hidden_shares", arguments, _to_json(table.rename_axis("hook").reset_index()))
    return table

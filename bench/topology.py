"""Flat against hierarchical communication on two nodes of two ranks, behind slow uplinks: measured and modelled.

For each uplink rate (one Cluster of ``--nodes`` x ``--ranks-per-node`` ranks per rate, ``nodes=`` and ``link=``):

1. each link class, measured from the ranks: a large send inside a node (rank 0 -> 1) and between nodes (0 -> L),
   the payload rate each got against the rate set, and a 4-byte all-reduce inside a node and between the node
   leaders, per ring hop (the model's alphas);
2. every hook, DDP's own timing (``timing=True``, no probe waits or copies), ``--steps`` steps, the first
   ``WARMUP_STEPS`` left out: rank 0's step time (median, min-max) and its bytes per step inside and between nodes
   (the probe's ``intra_bytes`` and ``inter_bytes``: ring bytes by the group each collective was issued on);
3. the two-level alpha-beta model (``lab.network.two_level_seconds``): the ``noop`` step behind the same uplinks
   (forward, backward, optimizer, no communication) plus each hook's communication from its bytes and hops and
   the measured alphas and rates (``bare_model_ms``), plus what the hook adds to a step beyond that behind the
   first (fastest) uplink, which calibrates, as ``bench/links.py`` does (``model_ms``).

Prints the links, then one row per uplink and hook, with bytes and step time against flat all-reduce's.

    python bench/topology.py [--links 1gbit 100mbit 10mbit] [--steps 8] [--model mlp256|mlp]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import pandas as pd

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from commhooks_lab import ExperimentConfig, compare  # noqa: E402
from commhooks_lab.launcher import Cluster, netns_switch  # noqa: E402
from commhooks_lab.launcher.link_spec import as_link, payload_share  # noqa: E402
from commhooks_lab.studies import network  # noqa: E402
from commhooks_lab.studies.links import WARMUP_STEPS, step_statistics  # noqa: E402
from commhooks_lab.studies.nodes import measure_levels, tcp_segments  # noqa: E402

#: label -> (hook spec, hierarchical?): flat all-reduce (the baseline), flat fp16, flat PowerSGD, then the
#: hierarchical hook with each inter-node leg.
HOOKS = {
    "noop": ("noop", False),
    "allreduce": ("allreduce", False),
    "fp16": ("fp16", False),
    "power_sgd r1": ("power_sgd[matrix_approximation_rank=1,start_powerSGD_iter=2]", False),
    "hier float32": ("hierarchical", True),
    "hier fp16": ("hierarchical_fp16", True),
    "hier power_sgd r1": ("hierarchical_power_sgd[matrix_approximation_rank=1,start_powerSGD_iter=2]", True),
    "hier topk 1% + EF": ("hierarchical_topk[ratio=0.01]", True),
}
#: Fewer steps where a step takes a good part of a second.
STEPS_FOR = {"10mbit": 6}


def mlp256(seed: int = 0):
    """The digits MLP at hidden width 256 (85,002 parameters, 340 KB of float32 gradients): a 100 Mbit/s uplink
    takes tens of ms for it, so the uplink, not the ranks' latency, sets a flat step; 10 Mbit/s, hundreds."""
    import torch
    from torch import nn

    from commhooks_lab.engine.models import Task, digits

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    train, test = digits(seed)
    return Task(model, train, test, "cross_entropy", "digits 8x8 -> MLP 64-256-256-10 (85,002 parameters)")


def _run_link(args, model, link: str) -> tuple[network.TwoLevelNetwork, dict, dict]:
    """One Cluster on the topology behind ``link``: its link classes measured, then every hook timed, with the
    share of the TCP segments its ranks sent that were retransmissions: near 0 since the links put only pure ACKs
    first (:mod:`commhooks_lab.launcher.netns_switch`); 14-25 % at 10mbit before, when small data overtook queued
    data."""
    world = args.nodes * args.ranks_per_node
    with Cluster(world, nodes=args.nodes, link=link) as cluster:
        net, _ = measure_levels(cluster, link, args.nodes, args.ranks_per_node)
        base = ExperimentConfig(model=model, world_size=world, nodes=args.nodes, link=link,
                                steps=STEPS_FOR.get(link, args.steps), timing=True, measure=False)  # fmt: skip
        timed, resent = {}, {}
        for label, (spec, _) in HOOKS.items():
            before = cluster.run(tcp_segments)
            (timed[label],) = compare([base.replace(hook=spec, label=label)], cluster=cluster)
            after = cluster.run(tcp_segments)
            sent = sum(a[1] - b[1] for a, b in zip(after, before))
            resent[label] = sum(a[0] - b[0] for a, b in zip(after, before)) / max(sent, 1)
    return net, timed, resent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", nargs="+", default=["1gbit", "100mbit", "10mbit"], help="the first calibrates")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--model", default="mlp256", help="mlp256 (this file's) or a lab task name (mlp, wide)")
    args = parser.parse_args()
    why = netns_switch.why_unavailable()
    if why:
        print(f"nodes behind slow links are not available here: {why}")
        return 1
    pd.set_option("display.width", 250)
    started = time.perf_counter()
    model = mlp256 if args.model == "mlp256" else args.model
    link_rows, rows = [], []
    costs: dict[str, float] = {}
    for link in args.links:
        net, timed, resent = _run_link(args, model, link)
        set_gbps = as_link(link).rate_gbps
        link_rows.append({
            "uplink": link, "inter_set_mbit": 1e3 * set_gbps, "inter_mbit": 1e3 * net.inter_gbps,
            "inter_vs_goodput": net.inter_gbps / (set_gbps * payload_share()), "inter_alpha_us": net.inter_alpha_us,
            "intra_set": "unlimited", "intra_mbit": 1e3 * net.intra_gbps, "intra_alpha_us": net.intra_alpha_us,
        })  # fmt: skip
        noop_ms = step_statistics(timed["noop"])["median_ms"]
        for label, (_, hierarchical) in HOOKS.items():
            if label == "noop":
                continue
            t = network.two_level_traffic(timed[label], hierarchical, skip=WARMUP_STEPS)
            stats = step_statistics(timed[label])
            comm_ms = 1e3 * network.two_level_seconds(t, net)
            if link == args.links[0]:  # the calibration: what the hook adds to a step beyond its bytes' time
                costs[label] = max(0.0, stats["median_ms"] - noop_ms - comm_ms)
            model_ms = noop_ms + costs[label] + comm_ms
            rows.append({
                "uplink": link, "hook": label, "intra_KB": t["intra_bytes"] / 1e3, "inter_KB": t["inter_bytes"] / 1e3,
                "median_ms": stats["median_ms"], "min_ms": stats["min_ms"], "max_ms": stats["max_ms"],
                "bare_model_ms": noop_ms + comm_ms, "model_ms": model_ms,
                "measured_vs_model": stats["median_ms"] / model_ms, "retrans_%": 100 * resent[label],
            })  # fmt: skip
    table = pd.DataFrame(rows)
    flat = table[table["hook"] == "allreduce"].set_index("uplink")
    table.insert(4, "inter_vs_flat", table["inter_KB"] / table["uplink"].map(flat["inter_KB"]))
    table["speedup_vs_flat"] = table["uplink"].map(flat["median_ms"]) / table["median_ms"]
    world = args.nodes * args.ranks_per_node
    print(f"{world} ranks on {args.nodes} nodes x {args.ranks_per_node}, model {args.model}; links measured from the "
          f"ranks (payload Mbit/s; goodput = set x {payload_share():.3f}, TCP's share of the wire):")  # fmt: skip
    print(pd.DataFrame(link_rows).to_string(index=False, float_format="{:.4g}".format), end="\n\n")
    print(f"per step, rank 0 (a node leader): KB inside / between nodes (ring bytes by the collective's group); "
          f"DDP's own step time over steps {WARMUP_STEPS}+ (median, min-max); the two-level alpha-beta model: bare = "
          f"noop step + communication, model = bare + the hook's in-step cost from the {args.links[0]} rows "
          "(which calibrate):")  # fmt: skip
    print(table.to_string(index=False, float_format="{:.3g}".format), end="\n\n")
    predicted = table[table["uplink"] != args.links[0]]
    for name, column in (("model", predicted["measured_vs_model"]),
                         ("bare model", predicted["median_ms"] / predicted["bare_model_ms"])):  # fmt: skip
        print(f"measured within +-25 % of the {name}: {int(column.between(0.75, 1.25).sum())} of {len(column)} "
              "predicted rows")  # fmt: skip
    print(f"bench took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

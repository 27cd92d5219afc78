"""Does the alpha-beta model predict step time behind real slow links? Measured against modelled, per hook and link.

Three measurements on this machine (:mod:`commhooks_lab.studies.links`), then the model fed with them:

1. each link, measured from its ranks: the wire rate htb holds (set against achieved), the payload rate TCP
   gets, and a tiny all-reduce's time per ring step (latency);
2. each hook's local work: its step with a process group of one rank (no byte on a link) less the ``noop`` step;
3. every hook behind every link, DDP's own timing (``timing=True``), ``--repeats`` times (seed r for repeat r).

Prints the link table, then one row per link and hook: measured step time (median of the repeats' medians, and
min-max over all steps of all repeats), the model's step time and their ratio (goal 0.75-1.25), then where each
hook's measured time crosses all-reduce's against the model's break-even bandwidth (goal: within a factor 1.5).

    python bench/links.py [--repeats 3] [--links unlimited 5gbit 3gbit 2gbit 1gbit 100mbit 10mbit] [--world-size 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import pandas as pd

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from commhooks_lab.launcher import netns_switch  # noqa: E402
from commhooks_lab.studies import links as study  # noqa: E402

#: Fewer steps where a step takes seconds; every run leaves ``study.WARMUP_STEPS`` out.
STEPS_FOR = {"10mbit": 5, "20mbit": 5}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--links", nargs="+", default=["unlimited", "5gbit", "3gbit", "2gbit", "1gbit", "100mbit", "10mbit"]
    )
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    why = netns_switch.why_unavailable()
    if why:
        print(f"slow links are not available here: {why}")
        return 1
    pd.set_option("display.width", 200)
    started = time.perf_counter()

    alone = study.local_costs(world_size=args.world_size)
    timed = study.time_hooks(
        links=args.links, world_size=args.world_size, steps=args.steps, repeats=args.repeats, steps_for=STEPS_FOR
    )
    print(f"links ({args.world_size} ranks, each behind its own; rates the median of 5 transfers):")
    print(timed.link_table().to_string(index=False, float_format="{:.4g}".format), end="\n\n")

    fastest = args.links[0]
    in_step = study.in_step_costs(timed, at=fastest)
    costs = pd.DataFrame({"alone_ms": alone, "in_step_ms": in_step}) * 1e3
    print("each hook's work per step, ms: alone (its process group one rank; compute = the bare noop step) and in a")
    print(f"real step behind {fastest} (its step less noop's, less its bytes' time by the model):")
    print(costs.T.to_string(float_format="{:.2f}".format), end="\n\n")

    table = study.predict(timed, in_step)
    table.insert(6, "model_alone_ms", study.predict(timed, alone)["model_ms"])
    print(f"step time, measured (median of {args.repeats} repeats' medians; min-max over every step) and modelled")
    print(f"(with the in-step costs; model_alone_ms with the alone costs). The {fastest} rows calibrate:")
    print(table.to_string(index=False, float_format="{:.3g}".format), end="\n\n")
    predicted = table[table["link"] != fastest]
    for name, column in (("in-step", predicted["model_vs_measured"]),
                         ("alone", predicted["model_alone_ms"] / predicted["measured_ms"])):  # fmt: skip
        print(f"model ({name} costs) within +-25 % of the measured median: "
              f"{int(column.between(0.75, 1.25).sum())} of {len(column)} predicted rows")  # fmt: skip
    print()

    cross = study.crossings(timed, in_step)
    cross["model_alone_gbps"] = study.crossings(timed, alone)["model_gbps"]
    print("where each hook starts to pay off (wire rate, Gbit/s): the measured crossing of all-reduce's time (median,")
    print("min-max over repeats), the model's break-even with the in-step costs (and with the alone costs):")
    print(cross.to_string(index=False, float_format="{:.3g}".format), end="\n\n")
    ratio = cross["model_vs_measured"]
    print(f"break-even within a factor 1.5: {int(ratio.between(1 / 1.5, 1.5).sum())} of {len(cross)} hooks")
    print(f"bench took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

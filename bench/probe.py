"""What does measuring cost? Per-step time with the probe on vs off, for every hook, side by side.

One warm Cluster; for each hook, runs with the probe on and off alternate ``--repeats`` times.
A step's time covers forward, backward (the hook and the probe's copies) and the optimizer
step; the probe's float64 comparison runs batched after the last step, so the whole run's
wall time is printed too. Prints medians and on/off ratios (target per step: <= 1.5x).

    python bench/probe.py [--repeats 5] [--steps 20] [--model mlp] [--world-size 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import commhooks_lab as lab  # noqa: E402
from commhooks_lab.experiment import DEFAULT_COMPARISON, as_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    base = lab.ExperimentConfig(model=args.model, steps=args.steps, world_size=args.world_size)
    configs = [as_config(item, base) for item in DEFAULT_COMPARISON]
    rows = []
    with lab.Cluster(args.world_size) as cluster:
        lab.run(base, cluster=cluster)  # warm-up: imports, first-touch allocations
        for config in configs:
            step = {True: [], False: []}
            whole = {True: [], False: []}
            for _ in range(args.repeats):
                for measure in (False, True):
                    start = time.perf_counter()
                    result = lab.run(config.replace(measure=measure), cluster=cluster)
                    whole[measure].append(time.perf_counter() - start)
                    # the first two steps are DDP's bucket rebuild and PowerSGD's plain allreduce
                    step[measure].append(statistics.median(result.steps["step_time_s"].iloc[2:]))
            off, on = statistics.median(step[False]), statistics.median(step[True])
            run_off, run_on = statistics.median(whole[False]), statistics.median(whole[True])
            rows.append((config.name, off * 1e3, on * 1e3, on / off, run_off * 1e3, run_on * 1e3, run_on / run_off))
    print(
        f"\nprobe cost per step, {args.model}, {args.world_size} ranks, median of {args.repeats} runs x "
        f"{args.steps - 2} steps\n"
    )
    print(f"{'':<22} {'--- per step (hook + probe copies) ---':^38} {'--- whole run (with measuring) ---':^36}")
    print(f"{'hook':<22} {'off ms':>12} {'on ms':>12} {'on / off':>12} {'off ms':>12} {'on ms':>12} {'on / off':>10}")
    for name, off, on, ratio, run_off, run_on, run_ratio in rows:
        print(f"{name:<22} {off:>12.2f} {on:>12.2f} {ratio:>12.2f} {run_off:>12.1f} {run_on:>12.1f} {run_ratio:>10.2f}")


if __name__ == "__main__":
    main()

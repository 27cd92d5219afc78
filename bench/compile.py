"""What does torch.compile cost and buy a DDP run with a comm hook? Compile time and step time per mode.

For each compile mode of ``ExperimentConfig(compile=...)`` (eager; torch.compile with DDPOptimizer;
torch.compile with compiled autograd and the python reducer), the same ``--steps``-step run of a
hook on one warm Cluster, ``--repeats`` times, modes interleaved so that machine noise hits all
alike. The first step carries the compile; the later ones show the compiled step. Measuring is off
in every mode (compiled autograd cannot use the probe), so the modes do the same work. Prints
medians and the ratio to eager, and whether every mode trained bit-identical weights. Backend:
``aot_eager`` (the lab's; inductor's C++ build takes minutes on 2 cores).

    python bench/compile.py [--hooks fp16 topk] [--steps 10] [--repeats 3] [--model mlp]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import commhooks_lab as lab  # noqa: E402
from commhooks_lab.engine.config import COMPILE_BACKEND, COMPILE_MODES  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hooks", nargs="+", default=["fp16", "topk", "wire16_sum32"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="mlp")
    args = parser.parse_args()

    rows = []
    with lab.Cluster(world_size=2) as cluster:
        for hook in args.hooks:
            first: dict[str, list[float]] = {m: [] for m in COMPILE_MODES}
            later: dict[str, list[float]] = {m: [] for m in COMPILE_MODES}
            digests: dict[str, set] = {m: set() for m in COMPILE_MODES}
            for _ in range(args.repeats):
                for mode in COMPILE_MODES:
                    r = lab.run(
                        hook=hook, steps=args.steps, model=args.model, compile=mode, measure=False, cluster=cluster
                    )
                    times = r.steps["step_time_s"].tolist()
                    first[mode].append(times[0])
                    later[mode].append(statistics.median(times[1:]))
                    digests[mode].add(r.final["param_digests"][0])
            same = len(set().union(*digests.values())) == 1
            eager_first, eager_later = statistics.median(first["eager"]), statistics.median(later["eager"])
            for mode in COMPILE_MODES:
                f, s = statistics.median(first[mode]), statistics.median(later[mode])
                rows.append((hook, mode, f, f / eager_first, s * 1e3, s / eager_later, same))

    print(f"backend {COMPILE_BACKEND}, model {args.model}, 2 ranks, {args.steps} steps, medians of {args.repeats}")
    header = ("hook", "mode", "step 0 s", "x eager", "later step ms", "x eager", "same weights")
    print(f"{header[0]:<14}{header[1]:<19}{header[2]:>9}{header[3]:>9}{header[4]:>15}{header[5]:>9}  {header[6]}")
    for hook, mode, f, fr, s, sr, same in rows:
        print(f"{hook:<14}{mode:<19}{f:>9.3f}{fr:>9.1f}{s:>15.2f}{sr:>9.2f}  {same}")


if __name__ == "__main__":
    main()

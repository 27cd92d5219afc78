"""What does measuring cost as models grow? Step and run time with the probe's measurement on vs off.

One warm Cluster; a model-size axis (the digits MLP and CNN, ~10k parameters; a 1.05M MLP; an
11.2M-parameter CIFAR-style ResNet-18; the last two defined below with torch only). For each model
and hook, runs with ``measure=True`` and ``measure=False`` alternate ``--repeats`` times, so machine
noise hits both alike. A step's time covers forward, backward (the hook and the probe's copies) and
the optimizer step; the float64 comparison runs batched after steps, so the whole run's wall time is
printed too. Prints medians and on/off ratios (targets at ~11M parameters: <= 1.5x per step, <= 2x
per run).

    python bench/probe.py [--repeats 3] [--models mlp cnn mlp1m resnet18] [--world-size 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import commhooks_lab as lab  # noqa: E402
from commhooks_lab.engine.models import Task  # noqa: E402
from commhooks_lab.experiment import DEFAULT_COMPARISON, as_config  # noqa: E402


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.short(x))


def resnet18_task(seed: int = 0) -> Task:
    """CIFAR-style ResNet-18 (11.2M parameters) on 256 seeded random 3x32x32 images, 10 classes."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [_Block(cin, cout, stride), _Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)]
    gen = torch.Generator().manual_seed(seed + 1)
    x, y = torch.randn(256, 3, 32, 32, generator=gen), torch.randint(0, 10, (256,), generator=gen)
    data = torch.utils.data.TensorDataset(x, y)
    return Task(nn.Sequential(*layers), data, None, "cross_entropy", "CIFAR-style ResNet-18, random data")


def wide_mlp_task(seed: int = 0) -> Task:
    """A 1.05M-parameter MLP 512-1024-512-10 on 512 seeded random inputs: the middle of the size axis."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10))
    gen = torch.Generator().manual_seed(seed + 1)
    data = torch.utils.data.TensorDataset(
        torch.randn(512, 512, generator=gen), torch.randint(0, 10, (512,), generator=gen)
    )
    return Task(model, data, None, "cross_entropy", "MLP 512-1024-512-10, random data")


#: model axis: (label, model, steps, batch size per rank, hooks). Big models run fewer hooks and steps.
POWER_SGD_R2 = {"hook": "power_sgd", "state_options": {"matrix_approximation_rank": 2, "start_powerSGD_iter": 2}}
MODELS = {
    "mlp": ("mlp", 20, 32, DEFAULT_COMPARISON),
    "cnn": ("cnn", 20, 32, DEFAULT_COMPARISON),
    "mlp1m": (wide_mlp_task, 10, 32, ["allreduce", "fp16", POWER_SGD_R2]),
    "resnet18": (resnet18_task, 6, 4, ["allreduce", POWER_SGD_R2]),
}


def _parameters(model) -> int:
    from commhooks_lab.engine.models import build_task

    return sum(p.numel() for p in build_task(model, 0).model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    rows = []
    with lab.Cluster(args.world_size) as cluster:
        for label in args.models:
            model, steps, batch, hooks = MODELS[label]
            base = lab.ExperimentConfig(model=model, steps=steps, batch_size=batch, world_size=args.world_size)
            lab.run(base.replace(steps=2), cluster=cluster)  # warm-up: imports, first-touch allocations
            for config in (as_config(item, base) for item in hooks):
                step: dict[bool, list[float]] = {True: [], False: []}
                whole: dict[bool, list[float]] = {True: [], False: []}
                for _ in range(args.repeats):
                    for measure in (False, True):
                        start = time.perf_counter()
                        result = lab.run(config.replace(measure=measure), cluster=cluster)
                        whole[measure].append(time.perf_counter() - start)
                        # the first two steps are DDP's bucket rebuild and PowerSGD's plain allreduce
                        step[measure].append(statistics.median(result.steps["step_time_s"].iloc[2:]))
                off, on = statistics.median(step[False]), statistics.median(step[True])
                run_off, run_on = statistics.median(whole[False]), statistics.median(whole[True])
                rows.append((label, _parameters(model), config.name, steps, off, on, run_off, run_on))
    print(f"\nprobe cost, {args.world_size} ranks, median of {args.repeats} runs (step: median of steps 2..)\n")
    head = f"{'model':<9} {'params':>10} {'hook':<22} {'steps':>5} "
    print(head + f"{'step off ms':>12} {'on ms':>9} {'on/off':>7} {'run off ms':>11} {'on ms':>9} {'on/off':>7}")
    for label, params, name, steps, off, on, run_off, run_on in rows:
        print(
            f"{label:<9} {params:>10,} {name:<22} {steps:>5} {off * 1e3:>12.2f} {on * 1e3:>9.2f} {on / off:>7.2f} "
            f"{run_off * 1e3:>11.1f} {run_on * 1e3:>9.1f} {run_on / run_off:>7.2f}"
        )


if __name__ == "__main__":
    main()

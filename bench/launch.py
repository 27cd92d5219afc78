"""How much does the lab's launcher cost? Cold and warm runs of one small DDP job, side by side.

Every variant runs the same job (an MLP 784-256-10 in DDP, ``--steps`` SGD steps on seeded
random data) on 2 and 4 ranks; variants are interleaved so that machine noise hits all alike.
Prints medians and the ratio to bare ``torch.multiprocessing.spawn``.

    python bench/launch.py [--repeats 5] [--steps 10] [--world-sizes 2 4]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # every variant's ranks see the same threads
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import commhooks_lab  # noqa: E402


def ddp_steps(steps: int) -> float:
    """The job: a few DDP training steps in an already-initialised process group."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        x, y = torch.randn(32, 784, generator=gen), torch.randint(0, 10, (32,), generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
    return loss.item()


def lab_job(ctx, steps):
    return ddp_steps(steps)


def _bare_job(rank, world_size, port, steps):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    ddp_steps(steps)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accelerate_job(steps):
    if not dist.is_initialized():  # debug_launcher's PrepareForLaunch usually has done it
        dist.init_process_group("gloo")
    ddp_steps(steps)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warm-steps", type=int, default=20)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    try:
        from accelerate import debug_launcher
    except ImportError:
        debug_launcher = None

    rows = []
    for world_size in args.world_sizes:
        variants = {
            "torch.multiprocessing.spawn (bare)": lambda w=world_size: mp.spawn(
                _bare_job, args=(w, _free_port(), args.steps), nprocs=w
            ),
            "commhooks_lab.launch (spawn)": lambda w=world_size: commhooks_lab.launch(
                lab_job, args.steps, world_size=w
            ),
            "commhooks_lab.launch (forkserver)": lambda w=world_size: commhooks_lab.launch(
                lab_job, args.steps, world_size=w, start_method="forkserver"
            ),
        }
        if debug_launcher is not None:
            variants["accelerate.debug_launcher (fork)"] = lambda w=world_size: debug_launcher(
                _accelerate_job, args=(args.steps,), num_processes=w
            )
        times = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, fn in variants.items():
                times[name].append(timed(fn))
        with commhooks_lab.Cluster(world_size=world_size) as cluster:
            cluster.run(lab_job, 1)  # the cluster is warm: started, imports done
            times[f"Cluster.run, warm, {args.warm_steps} steps"] = [
                timed(lambda: cluster.run(lab_job, args.warm_steps)) for _ in range(args.repeats)
            ]
        base = statistics.median(times["torch.multiprocessing.spawn (bare)"])
        for name, samples in times.items():
            median = statistics.median(samples)
            rows.append((world_size, name, median, min(samples), median / base))

    print(
        f"\nlaunch cost, {args.repeats} runs each, {args.steps} DDP steps per cold run "
        f"(torch {torch.__version__}, {os.cpu_count()} cores)\n"
    )
    print(f"{'ranks':>5}  {'variant':<40} {'median s':>9} {'min s':>7} {'x bare spawn':>13}")
    for world_size, name, median, fastest, ratio in rows:
        print(f"{world_size:>5}  {name:<40} {median:>9.3f} {fastest:>7.3f} {ratio:>13.2f}")


if __name__ == "__main__":
    main()

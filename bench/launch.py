"""How much does the lab's launcher cost? First runs in fresh interpreters, then cold and warm runs.

1. **First run** (``--sections first-run``): what a learner's first cell in a new kernel costs. Each
   variant runs in ``--fresh-repeats`` new interpreters (interleaved), timed from the script's first
   line (before ``import commhooks_lab`` / ``import accelerate``) until the job returned: the lab's
   ``launch`` (ranks forked by the rank server, which the import starts) against Accelerate's
   ``debug_launcher`` (fork) on the same DDP job, and ``lab.run`` against ``debug_launcher`` running
   the lab's own per-rank experiment. Also the run alone, started 3 s after the imports (a person
   reading the next cell: the rank server has loaded torch by then). Ratio: median over
   ``debug_launcher``'s median in the same group (target <= 1.0).
2. **Dashboard** (``--sections dashboard``): HookLab's first click in a fresh interpreter, clicked at
   once and after a pause (target <= 1.5 s); see ``bench/dashboard.py``.
3. **Launch** (``--sections launch``): in one process, every variant runs the same job (an MLP
   784-256-10 in DDP, ``--steps`` SGD steps on seeded random data) on 2 and 4 ranks; variants are
   interleaved so that machine noise hits all alike. Prints medians and the ratio to bare
   ``torch.multiprocessing.spawn``, and how reliable each variant was: a bare gloo job now and then
   aborts at teardown ("terminate called without an active exception", SIGABRT) after its work is
   done, which fails the whole ``spawn`` call. Such runs are counted, not timed; the lab survives the
   same crash and reports it as a note.

    python bench/launch.py [--sections first-run dashboard launch] [--fresh-repeats 5] [--repeats 5]
                           [--steps 10] [--world-sizes 2 4]
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import socket
import statistics
import sys
import time
from collections import Counter

os.environ.setdefault("OMP_NUM_THREADS", "1")  # every variant's ranks see the same threads
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from _fresh import cell, median, time_fresh  # noqa: E402

import commhooks_lab  # noqa: E402


def ddp_steps(steps: int) -> float:
    """The job: a few DDP training steps in an already-initialised process group."""
    import torch
    import torch.distributed as dist

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


SURVIVED = "rank crash at teardown, reported as a note"


class _TeardownNotes(logging.Handler):
    """Counts the lab's notes about ranks that crashed at teardown after delivering their results."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "during teardown" in record.getMessage():
            self.count += 1


def _failure(exc: BaseException) -> str:
    """A short name for how an attempt failed (a rank's signal or exit code, or the exception type)."""
    signal_name = getattr(exc, "signal_name", None)
    if signal_name:
        return f"{signal_name}"
    code = getattr(exc, "exit_code", None)
    if code is not None:
        return f"exit code {code}"
    return type(exc).__name__


def attempt(fn, notes: _TeardownNotes) -> tuple[float | None, str | None]:
    """Time one run; a run that fails gives no time, only how it failed."""
    before = notes.count
    start = time.perf_counter()
    try:
        fn()
    except Exception as exc:
        return None, _failure(exc)
    elapsed = time.perf_counter() - start
    return elapsed, (SURVIVED if notes.count > before else None)


def _reliability(outcomes: list[str | None], runs: int) -> str:
    """'4/5 ok; 1 SIGABRT': runs that delivered their results, then how the others ended."""
    counts = Counter(o for o in outcomes if o is not None)
    failed = sum(n for why, n in counts.items() if why != SURVIVED)
    text = f"{runs - failed}/{runs} ok"
    return text + "".join(f"; {n} {why}" for why, n in counts.items())


#: The DDP job of the first-run section, defined in the fresh interpreter itself (it travels by value):
#: ``ddp_steps``'s own source, so both sections time the same job.
_JOB = "import time\nt0 = time.perf_counter()\n\n\n" + inspect.getsource(ddp_steps)
#: (imports, the run) of each first-run variant; the job itself is ``_JOB``'s.
_DEBUG_LAUNCHER = (
    """
from accelerate import debug_launcher


def job(steps):
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    ddp_steps(steps)
""",
    "debug_launcher(job, args=({steps},), num_processes={world_size})\n",
)
_LAB_LAUNCH = (
    """
import commhooks_lab as lab


def job(ctx, steps):
    return ddp_steps(steps)
""",
    "lab.launch(job, {steps}, world_size={world_size}{options})\n",
)
_LAB_RUN = ("\nimport commhooks_lab as lab\n", 'lab.run(hook="allreduce", steps={steps}, world_size={world_size})\n')
_DEBUG_LAUNCHER_EXPERIMENT = (
    """
from accelerate import debug_launcher


def job(steps):
    import torch
    import torch.distributed as dist

    from commhooks_lab import ExperimentConfig, WorkerContext
    from commhooks_lab.engine.ddp_job import ddp_job

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    ctx = WorkerContext(dist.get_rank(), dist.get_world_size(), "gloo", torch.device("cpu"))
    ddp_job(ctx, ExperimentConfig(hook="allreduce", steps=steps, world_size=dist.get_world_size()))
""",
    "debug_launcher(job, args=({steps},), num_processes={world_size})\n",
)
_NO_PREWARM = "import os\nos.environ['COMMHOOKS_LAB_PREWARM'] = '0'\n"
#: A person reads the next cell: the run starts this long after the imports, and only the run is timed.
READING_PAUSE_S = 3.0


def _snippet(parts: tuple[str, str], pause_s: float, prefix: str = "", **fill) -> str:
    imports, run = parts
    pause = f"time.sleep({pause_s})\nt0 = time.perf_counter()\n" if pause_s else ""
    return prefix + _JOB + imports + pause + run.format(**fill) + "print(time.perf_counter() - t0)\n"


def first_run_section(repeats: int, steps: int, world_size: int) -> None:
    """The first run in a fresh interpreter: the lab against debug_launcher, the same job in each group."""
    fill = {"steps": steps, "world_size": world_size, "options": ""}
    spawn = {**fill, "options": ", start_method='spawn'"}
    ddp, experiment = f"DDP job ({steps} steps)", f"lab experiment (allreduce, {steps} steps)"
    after = f"run {READING_PAUSE_S:g} s after import"
    groups = {
        (ddp, "import + run"): {
            "accelerate.debug_launcher (fork)": _snippet(_DEBUG_LAUNCHER, 0, **fill),
            "lab.launch (rank server, default)": _snippet(_LAB_LAUNCH, 0, **fill),
            "lab.launch (rank server started at the run)": _snippet(_LAB_LAUNCH, 0, _NO_PREWARM, **fill),
            "lab.launch (spawn)": _snippet(_LAB_LAUNCH, 0, **spawn),
        },
        (experiment, "import + run"): {
            "accelerate.debug_launcher (fork)": _snippet(_DEBUG_LAUNCHER_EXPERIMENT, 0, **fill),
            "lab.run (rank server, default)": _snippet(_LAB_RUN, 0, **fill),
        },
        (ddp, after): {
            "accelerate.debug_launcher (fork)": _snippet(_DEBUG_LAUNCHER, READING_PAUSE_S, **fill),
            "lab.launch (rank server, default)": _snippet(_LAB_LAUNCH, READING_PAUSE_S, **fill),
        },
        (experiment, after): {
            "accelerate.debug_launcher (fork)": _snippet(_DEBUG_LAUNCHER_EXPERIMENT, READING_PAUSE_S, **fill),
            "lab.run (rank server, default)": _snippet(_LAB_RUN, READING_PAUSE_S, **fill),
        },
    }
    snippets = {
        f"{job}|{when}|{name}": code for (job, when), variants in groups.items() for name, code in variants.items()
    }
    timed = time_fresh(snippets, repeats)
    print(
        f"\nfirst run in a fresh interpreter, {world_size} ranks, median of {repeats} interpreters each "
        f"(torch {torch.__version__}, {os.cpu_count()} cores); 'import + run': from the first line to the "
        f"job's end; '{after}': the run only\n"
    )
    print(f"{'job':<37} {'timed':<23} {'variant':<44} {'median s':>9} {'min s':>7} {'x debug_launcher':>17}  runs")
    for (job, when), variants in groups.items():
        base = median(timed[f"{job}|{when}|accelerate.debug_launcher (fork)"]["times"])
        for name in variants:
            times, failures = (timed[f"{job}|{when}|{name}"][k] for k in ("times", "failures"))
            m = median(times)
            ratio = m / base if m is not None and base else None
            runs = f"{len(times)}/{repeats} ok" + "".join(f"; {why}" for why in dict.fromkeys(failures))
            fastest = min(times) if times else None
            print(f"{job:<37} {when:<23} {name:<44} {cell(m, 9)} {cell(fastest, 7)} {cell(ratio, 17, 2)}  {runs}")


def dashboard_section(repeats: int, steps: int) -> None:
    from dashboard import first_click_rows, print_first_click

    print_first_click(first_click_rows(repeats, steps), repeats, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", default=["first-run", "dashboard", "launch"])
    parser.add_argument("--fresh-repeats", type=int, default=5, help="fresh interpreters per first-run variant")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warm-steps", type=int, default=20)
    parser.add_argument("--click-steps", type=int, default=20)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    if "first-run" in args.sections:
        first_run_section(args.fresh_repeats, args.steps, 2)
    if "dashboard" in args.sections:
        dashboard_section(args.fresh_repeats, args.click_steps)
    if "launch" in args.sections:
        launch_section(args)


def launch_section(args: argparse.Namespace) -> None:
    """In one process: cold launches of every variant, then warm Cluster runs."""
    try:
        from accelerate import debug_launcher
    except ImportError:
        debug_launcher = None
    notes = _TeardownNotes()
    lab_log = logging.getLogger("commhooks_lab")
    lab_log.addHandler(notes)
    lab_log.setLevel(logging.INFO)
    lab_log.propagate = False  # count the notes, do not print them between the timings

    rows = []
    for world_size in args.world_sizes:
        variants = {
            "torch.multiprocessing.spawn (bare)": lambda w=world_size: mp.spawn(
                _bare_job, args=(w, _free_port(), args.steps), nprocs=w
            ),
            "commhooks_lab.launch (spawn)": lambda w=world_size: commhooks_lab.launch(
                lab_job, args.steps, world_size=w, start_method="spawn"
            ),
            "commhooks_lab.launch (rank server)": lambda w=world_size: commhooks_lab.launch(
                lab_job, args.steps, world_size=w, start_method="forkserver"
            ),
        }
        if debug_launcher is not None:
            variants["accelerate.debug_launcher (fork)"] = lambda w=world_size: debug_launcher(
                _accelerate_job, args=(args.steps,), num_processes=w
            )
        times: dict[str, list[float]] = {name: [] for name in variants}
        outcomes: dict[str, list[str | None]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, fn in variants.items():
                elapsed, outcome = attempt(fn, notes)
                outcomes[name].append(outcome)
                if elapsed is not None:
                    times[name].append(elapsed)
        warm = f"Cluster.run, warm, {args.warm_steps} steps"
        with commhooks_lab.Cluster(world_size=world_size) as cluster:
            cluster.run(lab_job, 1)  # the cluster is warm: started, imports done
            runs = [attempt(lambda: cluster.run(lab_job, args.warm_steps), notes) for _ in range(args.repeats)]
        times[warm] = [t for t, _ in runs if t is not None]
        outcomes[warm] = [o for _, o in runs]
        bare = times["torch.multiprocessing.spawn (bare)"]
        base = statistics.median(bare) if bare else None
        for name, samples in times.items():
            median = statistics.median(samples) if samples else None
            ratio = median / base if median is not None and base else None
            fastest = min(samples) if samples else None
            rows.append((world_size, name, median, fastest, ratio, _reliability(outcomes[name], args.repeats)))

    print(
        f"\nlaunch cost in one process, {args.repeats} runs each, {args.steps} DDP steps per cold run "
        f"(torch {torch.__version__}, {os.cpu_count()} cores); failed runs are not timed\n"
    )
    print(f"{'ranks':>5}  {'variant':<40} {'median s':>9} {'min s':>7} {'x bare spawn':>13}  reliability")

    for world_size, name, median, fastest, ratio, reliability in rows:
        timing = f"{cell(median, 9, 3)} {cell(fastest, 7, 3)} {cell(ratio, 13, 2)}"
        print(f"{world_size:>5}  {name:<40} {timing}  {reliability}")


if __name__ == "__main__":
    main()

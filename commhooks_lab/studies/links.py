"""When does compression pay off *in time*? Measured on real rate-limited links, and the model held against it.

Every rank sits behind a link of its own (:mod:`commhooks_lab.launcher.link_spec`). Three measurements, each on
the ranks themselves:

- :func:`measure_link`: what the link does: the wire rate htb holds, the payload rate TCP gets from it, and
  the time of one small all-reduce (the model's latency alpha per ring step);
- :func:`local_costs`: what each hook costs without any network: its step run with the hook's process group
  a group of one rank (every cast, matrix product and top-k, no byte on a link), less the step of ``noop``;
- :func:`time_hooks`: step times of every hook behind every link, DDP's own (``timing=True``).

:func:`time_hooks` and :func:`race` are what the lessons run behind links; where this machine cannot build
them they return the run recorded on one that could, and say so (:mod:`.recorded`).

:func:`predict` feeds the first two into :mod:`commhooks_lab.studies.network`'s alpha-beta model and puts its
step time beside the measured one; :func:`crossings` finds where each hook's measured time crosses the
baseline's, against the model's break-even bandwidth; :func:`time_to_accuracy` reads runs behind a link
against the clock (notebook 12).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from ..engine.config import ExperimentConfig
from ..experiment import compare
from ..launcher import Cluster, Ranks, RankSpec
from ..launcher.link_spec import as_link, payload_share
from ..result import Result, ResultSet, _frame_from_json, _frame_to_json, from_json
from . import network, recorded

__all__ = [
    "crossings",
    "HOOKS",
    "in_step_costs",
    "LinkTimes",
    "LINKS",
    "local_costs",
    "measure_link",
    "predict",
    "race",
    "step_statistics",
    "time_hooks",
    "time_to_accuracy",
    "training_seconds",
]

#: The links the lab's timing study runs behind, fastest first.
LINKS = ("unlimited", "1gbit", "100mbit", "10mbit")
#: label -> hook spec: the baseline, a 16-bit cast, PowerSGD at two matrix ranks, and top-k.
HOOKS = {
    "allreduce": "allreduce",
    "fp16": "fp16",
    "power_sgd r1": "power_sgd[matrix_approximation_rank=1,start_powerSGD_iter=2]",
    "power_sgd r4": "power_sgd[matrix_approximation_rank=4,start_powerSGD_iter=2]",
    "topk 1%": "topk[ratio=0.01]",
}
#: The step with no communication at all: forward, backward, optimizer and the engine's own work per step.
BASE = "noop"
#: The largest transfer :func:`measure_link` makes (64 MB): a fast link's rate needs no more, and memory is shared.
MAX_FLOATS = 1 << 24
#: Steps left out of every timing: DDP rebuilds its buckets after the first, PowerSGD compresses from the third.
WARMUP_STEPS = 2


# -- the link ---------------------------------------------------------------------------------------------------


def _link_job(ctx, floats: int, small_repeats: int, transfers: int) -> dict:
    import torch
    import torch.distributed as dist

    from ..launcher.netns_switch import qdisc_bytes

    tiny = torch.ones(1)
    for _ in range(3):
        dist.all_reduce(tiny)  # gloo's pairs and TCP's windows are set up
    small = []
    for _ in range(small_repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tiny)
        small.append(time.perf_counter() - start)
    x = torch.ones(floats)
    dist.all_reduce(x)
    seconds, sent = [], []
    for _ in range(transfers):
        dist.barrier()
        before, start = qdisc_bytes(), time.perf_counter()
        dist.all_reduce(x)
        seconds.append(time.perf_counter() - start)
        sent.append(qdisc_bytes() - before)
    return {"small_s": float(np.median(small)), "seconds": seconds, "qdisc_bytes": sent}


def measure_link(
    link: str, world_size: int = 2, seconds: float = 0.4, transfers: int = 5, cluster: Cluster | None = None
) -> dict:
    """One link, measured on ``world_size`` ranks behind it: what it does with a large and a tiny all-reduce.

    ``wire_gbps``: bytes htb let through per second (Ethernet frames: what its rate counts) on rank 0's link;
    ``wire_gbps_best``: the same for the fastest transfer, the rate the link held (a stall on a busy machine only
    ever slows a transfer, so the median of two can fall short of a link that held its rate);
    ``payload_gbps``: the all-reduce's bytes over each link per second, ``2(W-1)/W x bytes / time``; both the
    median of ``transfers`` all-reduces, each sized to take about ``seconds`` at the set rate (at most
    ``MAX_FLOATS``; on a shared machine one transfer can come out a third slow);
    ``alpha_us``: a 4-byte all-reduce's time over its ``2(W-1)`` ring steps, the model's latency.
    """
    parsed = as_link(link)
    assert parsed is not None
    rate = parsed.rate_bits if parsed.rate_bits is not None else 4e9
    ring = 2 * (world_size - 1) / world_size
    floats = min(MAX_FLOATS, max(1 << 16, int(rate * payload_share() * seconds / 8 / 4 / ring)))
    with Ranks(cluster, fresh=cluster is None) as ranks:  # yours, else ranks of its own
        row = ranks(RankSpec(world_size, link=parsed)).run(_link_job, floats, 20, transfers)[0]
    times = np.array(row["seconds"])
    return {
        "link": parsed.spec,
        "set_gbps": parsed.rate_gbps,
        "wire_gbps": float(np.median(8 * np.array(row["qdisc_bytes"]) / times / 1e9)),
        "wire_gbps_best": float(np.max(8 * np.array(row["qdisc_bytes"]) / times / 1e9)),
        "payload_gbps": float(np.median(8 * ring * 4 * floats / times / 1e9)),
        "alpha_us": 1e6 * row["small_s"] / (2 * (world_size - 1)),
        "world_size": world_size,
    }


# -- what each hook costs without a network -----------------------------------------------------------------------


def _waiting(hook):
    """``hook``, finished before DDP goes on: what a timing run does for a hook that cannot overlap."""
    from ..hooks.contract import completed_future

    def waited(state, bucket):
        return completed_future(hook(state, bucket).wait())

    return waited


def _local_job(ctx, specs: dict[str, str], model: str, steps: int, seed: int) -> dict:
    """Every hook's step with its process group a group of one rank (this rank): all work, no network.

    The hooks take turns, one step each, so that a slow moment of the machine falls on all of them alike.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..engine.data import rank_batches
    from ..engine.ddp_setup import make_optimizer, waits_per_bucket
    from ..engine.models import build_task
    from ..hooks.choice import build_hook
    from ..hooks.local_sgd import group_of_one

    alone = group_of_one()
    runs = {}
    for label, spec in {"noop": "noop", **specs}.items():
        config = ExperimentConfig(
            hook=spec, model=model, seed=seed, world_size=ctx.world_size, timing=True, measure=False
        )
        choice = config.check(local=False)
        task = build_task(model, seed)
        ddp = DDP(task.model)
        hook, state = build_hook(choice, process_group=alone)
        if hook is not None:
            if waits_per_bucket(ctx, config, choice):  # as in a timing run (PowerSGD, top-k wait per bucket)
                hook = _waiting(hook)
            ddp.register_comm_hook(state, hook)
        optimizer = make_optimizer(config.optimizer, ddp.parameters(), config.lr)
        batches = rank_batches(task.train, ctx.rank, ctx.world_size, config.batch_size, seed)
        runs[label] = (ddp, optimizer, batches, task.loss_fn())
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(steps):
        for label, (ddp, optimizer, batches, loss_fn) in runs.items():
            x, y = next(batches)
            dist.barrier()  # the ranks share the cores as they do in a real step
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss_fn(ddp(x), y).backward()
            optimizer.step()
            times[label].append(time.perf_counter() - start)
    return {label: t[WARMUP_STEPS:] for label, t in times.items()}


def local_costs(
    hooks: Mapping[str, str] | None = None, model: str = "wide", world_size: int = 2, steps: int = 20, seed: int = 0
) -> dict[str, float]:
    """Seconds per step: ``compute`` (forward, backward, optimizer: the ``noop`` step) and each hook's local
    work (its step on a group of one rank, less ``compute``), rank 0's medians, all ranks working at once."""
    hooks = dict(HOOKS if hooks is None else hooks)
    with Ranks(fresh=True) as ranks:
        times = ranks(RankSpec(world_size)).run(_local_job, hooks, model, steps, seed)[0]
    compute = float(np.median(times["noop"]))
    costs = {label: max(0.0, float(np.median(times[label])) - compute) for label in hooks}
    return {"compute": compute, **costs}


# -- step times behind each link ------------------------------------------------------------------------------------


def step_statistics(result: Result, skip: int = WARMUP_STEPS) -> dict:
    """Rank 0's step time (ms) over the steps after ``skip`` where the hook compressed: median, min, max."""
    ms = result.step_ms(skip, compressed=True)
    return {"median_ms": ms["median"], "min_ms": ms["min"], "max_ms": ms["max"], "steps": ms["steps"]}


@dataclasses.dataclass
class LinkTimes:
    """What :func:`time_hooks` measured: each link (:func:`measure_link`), one row per (link, hook, repeat) of
    step times (:func:`step_statistics`), and each hook's bytes and collectives per step (for the model)."""

    links: list[dict]
    times: pd.DataFrame
    traffics: dict[str, dict]

    def link_table(self) -> pd.DataFrame:
        """The links as measured, with the wire rate htb held (its fastest transfer; the median where a recording
        made before that was kept has no fastest) over the rate it was set to."""
        table = pd.DataFrame(self.links)
        held = table["wire_gbps_best"].fillna(table["wire_gbps"]) if "wire_gbps_best" in table else table["wire_gbps"]
        table["achieved_vs_set"] = held / table["set_gbps"]
        return table

    def to_json(self) -> dict:
        return {"links": self.links, "times": _frame_to_json(self.times), "traffics": self.traffics}

    @classmethod
    def from_json(cls, data: dict) -> LinkTimes:
        return cls(data["links"], _frame_from_json(data["times"]), data["traffics"])


def time_hooks(
    hooks: Mapping[str, str] | None = None,
    links: Sequence[str] = LINKS,
    model: str = "wide",
    world_size: int = 2,
    steps: int = 6,
    repeats: int = 1,
    steps_for: Mapping[str, int] | None = None,
    transfers: int = 5,
    seconds: float = 0.4,
) -> LinkTimes:
    """Every hook behind every link, ``repeats`` times each (seed r for repeat r), and each link measured.

    One set of ranks per link and repeat; the first measures its link (``transfers`` all-reduces of about
    ``seconds`` each, :func:`measure_link`).
    ``noop`` runs first behind every link: the step of the same engine with no communication, the model's base.
    ``steps_for``: fewer steps behind slow links, e.g. ``{"10mbit": 4}``; every run keeps ``WARMUP_STEPS``
    out of its statistics. Where this machine cannot build links: the run of this same call recorded on one that
    could (:func:`.recorded.replay`, which says so), else ``NetworkUnavailableError`` naming the links.
    """
    hooks = {BASE: BASE, **(HOOKS if hooks is None else hooks)}
    for link in links:
        as_link(link)  # a wrong spec is refused as such, wherever it runs
    arguments = dict(hooks=hooks, links=links, model=model, world_size=world_size, steps=steps, repeats=repeats,
                     steps_for=steps_for, transfers=transfers, seconds=seconds)  # fmt: skip
    if recorded.why_replayed() is not None:
        return LinkTimes.from_json(recorded.replay("time_hooks", arguments, f"links={tuple(links)}"))
    rows: list[dict] = []
    traffics: dict[str, dict] = {}
    facts: dict[str, dict] = {}
    for repeat in range(repeats):  # repeats outermost: a slow minute of the machine falls on every link alike
        for link in links:
            n = (steps_for or {}).get(link, steps)
            base = ExperimentConfig(
                model=model, world_size=world_size, steps=n, seed=repeat, link=link, timing=True, measure=False
            )
            with Ranks(fresh=True) as ranks:
                cluster = ranks(base.rank_spec())
                if link not in facts:
                    facts[link] = measure_link(link, world_size, seconds, transfers, cluster)
                configs = [base.replace(hook=spec, label=label) for label, spec in hooks.items()]
                results = compare(configs, cluster=cluster)
            for result in results:
                traffics.setdefault(result.name, network.traffic(result))
                rows.append({"link": link, "hook": result.name, "repeat": repeat, **step_statistics(result)})
    times = pd.DataFrame(rows).sort_values(["link", "hook", "repeat"], key=_in_order(links, hooks))
    timed = LinkTimes([facts[link] for link in links], times.reset_index(drop=True), traffics)
    recorded.keep("time_hooks", arguments, timed.to_json())
    return timed


def _in_order(links: Sequence[str], hooks: Mapping[str, str]):
    """A sort key that keeps links and hooks in the order they were given."""
    order = {"link": list(links), "hook": list(hooks)}
    return lambda column: column.map(order[column.name].index) if column.name in order else column


# -- the model, held against the measurement ---------------------------------------------------------------------


def in_step_costs(timed: LinkTimes, at: str = "unlimited") -> dict[str, float]:
    """Seconds each hook adds to a real step, less its bytes' time: measured behind the ``at`` link.

    :func:`local_costs` runs a hook on a group of one rank, where every collective completes at once. In a
    real step each of PowerSGD's chained collectives also waits for the other ranks (who arrive apart: two
    ranks share two cores with everything else) and hands its callback to gloo's thread. This calibration
    takes a hook's step behind the fastest link, where bytes cost least, less the ``noop`` step and less its
    bytes' time by the model, as what the hook costs, and lets the model predict every slower link from it.
    """
    facts = {link["link"]: link for link in timed.links}[at]
    fast = timed.times[timed.times["link"] == at].groupby("hook")["median_ms"].median()
    costs = {}
    for hook, ms in fast.items():
        if hook == BASE:
            continue
        t = timed.traffics[str(hook)]
        comm = network.comm_seconds(t, facts["world_size"], facts["payload_gbps"], facts["alpha_us"])
        costs[str(hook)] = max(0.0, (ms - fast[BASE]) / 1e3 - comm)
    return costs


def _model_ms(base_ms: float, traffic: Mapping[str, float], local_s: float, link: Mapping) -> float:
    comm = network.comm_seconds(traffic, link["world_size"], link["payload_gbps"], link["alpha_us"])
    return base_ms + 1e3 * (local_s + comm)


def predict(timed: LinkTimes, costs: Mapping[str, float]) -> pd.DataFrame:
    """Measured step time (median over repeats of each run's median, and the range over all) beside the model's.

    The model: ``the noop step behind the same link + the hook's work (costs) + alpha x ring steps + bytes over
    each link / bandwidth`` (:func:`commhooks_lab.studies.network.comm_seconds`), with the link's bandwidth and
    latency as :func:`measure_link` measured them (what iperf and a ping would tell you of a real link), nothing
    hidden by overlap.
    """
    facts = {link["link"]: link for link in timed.links}
    times = timed.times
    rows = []
    for (link, hook), group in times.groupby(["link", "hook"], sort=False):
        if hook == BASE:
            continue
        base_ms = times[(times["link"] == link) & (times["hook"] == BASE)]["median_ms"].median()
        model = _model_ms(base_ms, timed.traffics[hook], costs.get(hook, 0.0), facts[link])
        measured = group["median_ms"].median()
        rows.append(
            {
                "link": link,
                "hook": hook,
                "measured_ms": measured,
                "min_ms": group["min_ms"].min(),
                "max_ms": group["max_ms"].max(),
                "model_ms": model,
                "model_vs_measured": model / measured,
            }
        )
    return pd.DataFrame(rows)


def _crossing(x: np.ndarray, gap: np.ndarray) -> float:
    """Where ``gap`` (a hook's step less the baseline's, against ``x`` = 1 / rate, fastest link first) first
    turns from positive to not, linearly in ``x`` (a step's time is linear in 1 / rate): that rate, Gbit/s.
    ``inf``: the hook is not slower even on the fastest link; ``nan``: it is slower on every link."""
    if gap[0] <= 0:
        return math.inf
    for i in range(1, len(x)):
        if gap[i] <= 0:
            crossed = x[i - 1] + gap[i - 1] / (gap[i - 1] - gap[i]) * (x[i] - x[i - 1])
            return 1.0 / crossed
    return math.nan


def crossings(timed: LinkTimes, costs: Mapping[str, float], baseline: str = "allreduce") -> pd.DataFrame:
    """Where each hook's measured step time crosses the baseline's, and where the model puts it (wire Gbit/s).

    Measured, in each repeat: the gap between the hook's median step and the baseline's behind each link,
    against 1 / the payload rate :func:`measure_link` measured on that link (htb holds less than it is set to
    above about 1 Gbit/s), and the rate where the gap changes sign, interpolated between the two links around
    it; the median and range over repeats. Model: :func:`network.break_even` with ``costs`` and the links'
    median latency. Rates are wire rates (what a link is set to), the payload rate over :func:`payload_share`.
    ``inf``: no slower on any link measured; ``nan``: slower on all.
    """
    facts = sorted(timed.links, key=lambda link: -link["payload_gbps"])
    x = np.array([1.0 / link["payload_gbps"] for link in facts])
    order = [link["link"] for link in facts]
    found: dict[str, list[float]] = {}
    for _, run in timed.times.groupby("repeat"):
        ms = run.pivot_table(index="hook", columns="link", values="median_ms")[order]
        for hook in ms.index.drop([baseline, BASE], errors="ignore"):
            gap = (ms.loc[hook] - ms.loc[baseline]).to_numpy()
            found.setdefault(str(hook), []).append(_crossing(x, gap) / payload_share())
    w = facts[0]["world_size"]
    alpha = float(np.median([link["alpha_us"] for link in facts]))
    kept = {label: t for label, t in timed.traffics.items() if label != BASE}
    local = {label: costs.get(label, 0.0) for label in kept}
    model = network.break_even(kept, local, world_size=w, latency_us=alpha, baseline=baseline).set_index("hook")
    rows = []
    for hook, values in found.items():
        measured = float(np.median(values))
        predicted = model.loc[hook, "break_even_gbps"] / payload_share()
        rows.append(
            {
                "hook": hook,
                "measured_gbps": measured,
                "min_gbps": min(values),
                "max_gbps": max(values),
                "model_gbps": predicted,
                "model_vs_measured": predicted / measured if math.isfinite(measured) and measured else math.nan,
            }
        )
    return pd.DataFrame(rows)


# -- time to accuracy --------------------------------------------------------------------------------------------


def race(hooks: Sequence[str], link: str, seeds: Sequence[int] = (0,), **settings) -> ResultSet:
    """Every hook behind ``link``, once per seed (``lab.compare(hooks, link=link, seed=seed, **settings)``): the
    runs :func:`time_to_accuracy` reads. Where this machine cannot build links, as :func:`time_hooks`."""
    as_link(link)
    arguments = dict(hooks=list(hooks), link=link, seeds=list(seeds), **settings)
    if recorded.why_replayed() is not None:
        runs = recorded.replay("race", arguments, f"link={link!r}")
        return ResultSet(from_json(run, recorded.DIRECTORY) for run in runs)
    raced = ResultSet(r for seed in seeds for r in compare(list(hooks), link=link, seed=seed, **settings))
    recorded.keep("race", arguments, [r.to_json() for r in raced])
    return raced


def training_seconds(result: Result) -> pd.Series:
    """Rank 0's training time after each step (the sum of ``step_time_s``: evaluation left out), by step."""
    return result.steps.set_index("step")["step_time_s"].cumsum()


def time_to_accuracy(results: Sequence[Result], target: float) -> pd.DataFrame:
    """Per run: the training seconds (:func:`training_seconds`) at the first evaluation whose test accuracy is at
    least ``target`` (``inf`` if none is), the step it came at, and the whole run's training seconds."""
    rows = []
    for r in results:
        seconds = training_seconds(r)
        evaluated = r.steps.dropna(subset=["accuracy"]).set_index("step")["accuracy"]
        reached = evaluated[evaluated >= target]
        step = int(reached.index[0]) if len(reached) else None
        rows.append(
            {
                "hook": r.name,
                "seed": r.config["seed"],
                "step": step,
                "seconds": float(seconds[step]) if step is not None else math.inf,
                "run_seconds": float(seconds.iloc[-1]),
            }
        )
    return pd.DataFrame(rows)

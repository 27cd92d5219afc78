"""``score(my_hook)``: a hook on the challenge's fixed task set, reported as its parts and one number.

For each task t (:data:`~commhooks_lab.challenge.tasks.TASKS`), the lab runs the hook with the course's seed for a
fixed number of steps and reads back, from its own probe:

- ``accuracy``: the test accuracy reached at the last step;
- ``bytes_per_rank``: every byte rank 0 handed to collectives (the hook's own ``dist.all_reduce`` calls included);
- ``rank_spread``: the largest difference between ranks' gradients over the run (DDP's invariant wants 0);
- ``t_hook``: the α/β model's communication time on :data:`~commhooks_lab.challenge.tasks.REFERENCE_NETWORK`, fed
  those exact bytes and collective calls (a model, not a measurement); ``t_allreduce``: the same for PyTorch's
  all-reduce of the same task and steps, from the lab's byte rule. On a task on nodes, the two-level model
  (:func:`~commhooks_lab.studies.network.two_level_seconds`) fed each rank's bytes and ring steps inside and
  between nodes, and ``t_hook`` is the busiest rank's: a hook cannot hide its traffic on a rank other than 0.

Then ``speed = 2 t_allreduce / (t_allreduce + t_hook)`` (1 for all-reduce, up to 2 for a hook that sends nothing),
``points = accuracy x speed``, and ``score = 100 x mean over tasks of points``. A hook that breaks DDP's invariant
(any rank_spread > 0, or ranks ending with other parameters), sends bytes the counter cannot see, or fails, is
disqualified with the reason and has no score. Everything is bytes and seeded arithmetic under the lab's portable
numerics: the same bits on every x86-64 CPU with AVX2 (older CPUs share another tier, named in the numerics).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .tasks import REFERENCE_NETWORK, TASKS, ChallengeTask, ReferenceNetwork, task_set_of, tasks_of

__all__ = [
    "BASELINES",
    "FORMULA",
    "NODES_BASELINES",
    "Score",
    "baseline_specs",
    "baselines",
    "first_lines",
    "points",
    "ranked",
    "score",
    "speed",
    "table",
    "worst_rank_spread",
]

FORMULA = (
    "score = 100 x mean over tasks of (accuracy x speed); speed = 2 t_allreduce / (t_allreduce + t_hook), "
    "t = the α/β model's communication time for the run's exact bytes and calls"
)

#: The lab's reference hooks, as a learner meets them in the baseline table (name -> spec).
BASELINES: dict[str, str] = {
    "all-reduce": "allreduce",
    "fp16": "fp16",
    "PowerSGD r1": "power_sgd[matrix_approximation_rank=1,start_powerSGD_iter=2]",
    "PowerSGD r4": "power_sgd[matrix_approximation_rank=4,start_powerSGD_iter=2]",
    "top-k 1% + EF": "topk[ratio=0.01,error_feedback=true]",
}

#: Beside them on a task set with nodes: the float32 sum inside each node, fp16 only between nodes (issue 49's hook).
NODES_BASELINES: dict[str, str] = {"hierarchical fp16": "hierarchical_fp16"}


def baseline_specs(tasks: Sequence[ChallengeTask] = TASKS) -> dict[str, str]:
    """The reference hooks for ``tasks``: :data:`BASELINES`, and :data:`NODES_BASELINES` where a task is on nodes."""
    return BASELINES | (NODES_BASELINES if any(task.nodes > 1 for task in tasks) else {})


#: The versions a score's bits depend on (the rest of ``Score.versions`` says where and how it ran).
FINGERPRINTED_VERSIONS = ("commhooks_lab", "torch", "numerics")

#: The note the probe adds when a rank wrote more to its sockets than its counted collectives explain.
_UNSEEN_BYTES = "wire_bytes:"


def speed(t_allreduce: float, t_hook: float) -> float:
    """2 t_allreduce / (t_allreduce + t_hook): 1 for all-reduce's own time, 2 for none."""
    return 2.0 * t_allreduce / (t_allreduce + t_hook)


def points(accuracy: float, t_allreduce: float, t_hook: float) -> float:
    return accuracy * speed(t_allreduce, t_hook)


@dataclass
class Score:
    """A hook's score and its parts; ``disqualified`` says why there is none."""

    label: str
    tasks: list[dict] = field(default_factory=list)
    disqualified: str | None = None
    network: str = REFERENCE_NETWORK.describe()
    task_set: str = task_set_of(TASKS)
    versions: dict = field(default_factory=dict)
    #: step times behind a real link, where one was asked for (:mod:`.measured`): reported, never scored
    measured: list = field(default_factory=list)

    @property
    def value(self) -> float | None:
        if self.disqualified is not None or not self.tasks:
            return None
        return 100.0 * math.fsum(t["points"] for t in self.tasks) / len(self.tasks)

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "score": self.value,
            "disqualified": self.disqualified,
            "tasks": self.tasks,
            "network": self.network,
            "task_set": self.task_set,
            "formula": FORMULA,
            "versions": self.versions,
            "measured": self.measured,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Score:
        return cls(
            str(data["label"]),
            list(data["tasks"]),
            data["disqualified"],
            str(data["network"]),
            str(data["task_set"]),
            dict(data["versions"]),
            list(data.get("measured") or []),
        )

    @property
    def fingerprint(self) -> str:
        """sha256 of the parts (floats as their exact hex), the task set and the lab's version: two scores made
        anywhere agree bit for bit exactly when their fingerprints do. Neither the label nor where it ran (the
        sandbox's isolation, the source's digest) is part of it: a learner's own score and the leaderboard's match."""
        data = {k: v for k, v in self.to_dict().items() if k not in ("label", "versions", "measured")}
        data["versions"] = {k: self.versions.get(k) for k in FINGERPRINTED_VERSIONS}
        return hashlib.sha256(json.dumps(_exact(data), sort_keys=True).encode()).hexdigest()[:16]

    def table(self):
        import pandas as pd

        return pd.DataFrame(self.tasks).set_index("task")

    def report(self) -> str:
        head = f"{self.label}: " + (
            f"DISQUALIFIED: {self.disqualified}" if self.value is None else f"score {self.value:.2f}"
        )
        lines = [head, f"  {FORMULA}", f"  reference network: {self.network}"]
        width = max([6, *(len(t["task"]) + 1 for t in self.tasks)])
        lines.append(
            f"  {'task':<{width}}{'steps':>6}{'accuracy':>10}{'bytes/rank':>14}{'rank_spread':>13}"
            f"{'t_hook s':>10}{'t_allreduce s':>15}{'speed':>7}{'points':>8}"
        )
        for t in self.tasks:
            lines.append(
                f"  {t['task']:<{width}}{t['steps']:>6}{t['accuracy']:>10.4f}{t['bytes_per_rank']:>14,}"
                f"{t['rank_spread']:>13.3g}{t['t_hook_s']:>10.4f}{t['t_allreduce_s']:>15.4f}{t['speed']:>7.3f}"
                f"{t['points']:>8.4f}"
            )
        if self.measured:
            from .measured import describe_measured

            lines += describe_measured(self.measured)
        lines.append(
            f"  task set {self.task_set}, commhooks_lab {self.versions.get('commhooks_lab')}, "
            f"fingerprint {self.fingerprint}"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(self.report())


def _exact(value: Any) -> Any:
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, dict):
        return {k: _exact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_exact(v) for v in value]
    return value


def lab_versions() -> dict:
    import torch

    from .. import __version__
    from ..launcher import numerics

    # the mode and the kernels it runs: portable numerics have two tiers (AVX2, and older CPUs' plain C++)
    capability = torch.backends.cpu.get_cpu_capability()
    kernels = numerics.TIERS.get(capability, capability)
    return {"commhooks_lab": __version__, "torch": torch.__version__, "numerics": f"{numerics.mode()} ({kernels})"}


def _totals(steps) -> dict:
    gathered = int(steps["allgather_bytes"].sum())
    gather_calls = int(steps["allgather_calls"].sum())
    return {
        "allreduce_bytes": int(steps["payload_bytes"].sum()) - gathered,
        "allgather_bytes": gathered,
        "allreduce_calls": int(steps["collective_calls"].sum()) - gather_calls,
        "allgather_calls": gather_calls,
    }


def reference_seconds(task: ChallengeTask, network: ReferenceNetwork = REFERENCE_NETWORK) -> float:
    """All-reduce's modelled time on ``task``: its byte rule for the task's model, every step, one call per step
    (both models fit DDP's one 25 MB bucket, as the probe counts them; a test holds all-reduce's speed to 1)."""
    from ..engine.models import build_task
    from ..studies.network import comm_seconds, parameter_shapes, rule_traffic, two_level_rule, two_level_seconds

    shapes = parameter_shapes(build_task(task.model, task.seed).model)
    if task.nodes > 1:
        net = network.two_level(task)
        rule = two_level_rule(shapes, "allreduce", nodes=net.nodes, ranks_per_node=net.ranks_per_node, buckets=1)
        return task.steps * two_level_seconds(rule, net)
    per_step = rule_traffic(shapes, "allreduce", buckets=1)
    totals = {
        k: task.steps * per_step[k]
        for k in ("allreduce_bytes", "allgather_bytes", "allreduce_calls", "allgather_calls")
    }
    return comm_seconds(totals, task.world_size, network.bandwidth_gbps, network.latency_us)


def _accuracy(result) -> float:
    """The test accuracy at the last step (rank 0's model; the ranks agree when the invariant holds)."""
    return float(result.final.get("accuracy", math.nan))


def worst_rank_spread(steps):
    """The step whose ``rank_spread`` is largest, or None when every rank left every hook with the same gradient."""
    return steps.loc[steps["rank_spread"].idxmax()] if (steps["rank_spread"] != 0).any() else None


def _why_disqualified(result) -> str | None:
    worst = worst_rank_spread(result.steps)
    if worst is not None:
        return (
            f"breaks DDP's invariant: after the hook the ranks hold different gradients (rank_spread "
            f"{worst['rank_spread']:.3g} at step {int(worst['step'])}; every rank must leave the same gradient)"
        )
    if len(set(result.final["param_digests"])) > 1:
        return "breaks DDP's invariant: the ranks ended with different parameters"
    unseen = [n for n in result.notes if n.startswith(_UNSEEN_BYTES)]
    if unseen:
        return f"sends bytes the lab's counter cannot see: {unseen[0]}"
    if not math.isfinite(_accuracy(result)):
        return "no test accuracy: the model's outputs are not finite"
    return None


def _hook_seconds(result, task: ChallengeTask, network: ReferenceNetwork) -> float:
    """The model's time for the run's counted traffic: rank 0's bytes and calls on a flat task; on nodes, the
    busiest rank's bytes and ring steps per level (each rank's sums over the run, ``final["link_totals"]``)."""
    from ..studies.network import comm_seconds, two_level_seconds

    if task.nodes == 1:
        return comm_seconds(_totals(result.steps), task.world_size, network.bandwidth_gbps, network.latency_us)
    net = network.two_level(task)
    return max(two_level_seconds(counts, net) for counts in result.final["link_totals"])


def score_task(result, task: ChallengeTask, network: ReferenceNetwork = REFERENCE_NETWORK) -> dict:
    """One task's parts, from its run."""
    t_hook = _hook_seconds(result, task, network)
    t_ref = reference_seconds(task, network)
    accuracy = _accuracy(result)
    return {
        "task": task.name,
        "steps": task.steps,
        "accuracy": accuracy,
        "bytes_per_rank": int(result.steps["payload_bytes"].sum()),
        "rank_spread": float(result.steps["rank_spread"].max()),
        "t_hook_s": t_hook,
        "t_allreduce_s": t_ref,
        "speed": speed(t_ref, t_hook),
        "points": points(accuracy, t_ref, t_hook),
    }


def _label(hook: Any) -> str:
    if isinstance(hook, str):
        return next((name for name, spec in (BASELINES | NODES_BASELINES).items() if spec == hook), hook)
    return getattr(hook, "__name__", type(hook).__name__)


def score(
    hook: Any,
    *,
    state_factory: Callable | None = None,
    state_options: dict | None = None,
    label: str | None = None,
    tasks: str | Sequence[ChallengeTask] = TASKS,
    network: ReferenceNetwork = REFERENCE_NETWORK,
    cluster=None,
    fresh: bool = False,
    timeout_s: float | None = None,
    link: str | None = None,
) -> Score:
    """Score ``hook`` (your ``hook(state, bucket)``, a registered name or spec) on the challenge's tasks: a task
    set's name (``"hook-challenge-nodes-1"`` adds the two-node task) or a sequence of tasks.

    ``state_factory(process_group)`` makes your hook's state; the runs go to the session's warm ranks, to
    ``cluster`` (one Cluster or a list: the tasks whose ranks one holds; the others go where they would without
    it), or to fresh ones;
    ``timeout_s``: seconds without a finished step before a run is called hung. A hook that fails or breaks DDP's
    invariant comes back disqualified, with why. ``link`` ("1gbit", "100mbit"): each task also timed behind a real
    link of that rate, beside all-reduce (:mod:`.measured`), reported with the score and never part of it or of
    its fingerprint.
    """
    from ..experiment import run

    tasks = tasks_of(tasks)
    on_nodes = any(task.nodes > 1 for task in tasks)
    result = Score(
        label or _label(hook),
        network=network.describe(nodes=on_nodes),
        task_set=task_set_name(tasks),
        versions=lab_versions(),
    )
    for task in tasks:
        options: dict[str, Any] = {**task.run_options(), "state_options": dict(state_options or {})}
        if timeout_s is not None:
            options["timeout_s"] = timeout_s
        ranks = next((c for c in _clusters(cluster) if _fits(c, task)), None)
        try:
            run_result = run(
                hook=hook, state_factory=state_factory, cluster=ranks, fresh=fresh and ranks is None, **options
            )
        except Exception as exc:  # the hook's own failure is the score's answer, with its reason
            result.disqualified = f"failed on {task.model}: {type(exc).__name__}: {first_lines(str(exc))}"
            return result
        why = _why_disqualified(run_result)
        result.tasks.append(score_task(run_result, task, network))
        if why is not None:
            result.disqualified = f"{why} (task {task.model})"
            return result
    if link is not None:
        from .measured import measure_behind_link

        try:
            result.measured = measure_behind_link(hook, link, tasks, state_factory, state_options, timeout_s)
        except Exception as exc:  # no link on this machine (no user namespaces, say): the score stands without it
            result.measured = [
                {"task": "-", "link": link, "unmeasured": f"{type(exc).__name__}: {first_lines(str(exc))}"}
            ]
    return result


def _clusters(cluster) -> list:
    """``cluster``: None, one Cluster, or several (one per shape of ranks the tasks need)."""
    if cluster is None:
        return []
    return list(cluster) if isinstance(cluster, list | tuple) else [cluster]


def _fits(cluster, task: ChallengeTask) -> bool:
    """Are ``cluster``'s ranks the ones ``task`` runs on (as many, on as many nodes, no link)?"""
    return (cluster.world_size, cluster.spec.nodes, cluster.spec.link) == (task.world_size, task.nodes, None)


def task_set_name(tasks: Sequence[ChallengeTask] = TASKS) -> str:
    """The task set's name, and the seed set where one is chosen (``COMMHOOKS_LAB_SEED_SET``): it moves every
    task's seed, so its scores compare only with scores under the same one."""
    from ..engine.seed_set import SEED_SET_VARIABLE, effective_seed

    name = task_set_of(tasks)
    return name if effective_seed(0) == 0 else f"{name}, seed set {os.environ[SEED_SET_VARIABLE].strip()}"


def ranked(scores: Sequence[Score]) -> list[Score]:
    """Scored entries first, best first (ties by label), then the disqualified ones by label."""
    return sorted(scores, key=lambda s: (s.value is None, -(s.value or 0.0), s.label))


def baselines(
    cluster=None, tasks: str | Sequence[ChallengeTask] = TASKS, network: ReferenceNetwork = REFERENCE_NETWORK
) -> list[Score]:
    """The lab's reference hooks (:func:`baseline_specs`) scored, best first: what beating PowerSGD means."""
    tasks = tasks_of(tasks)
    specs = baseline_specs(tasks)
    return ranked(
        [score(spec, label=name, cluster=cluster, tasks=tasks, network=network) for name, spec in specs.items()]
    )


def table(scores: Sequence[Score]):
    """One row per entry: its score, then each task's accuracy, bytes per rank and speed (a DataFrame)."""
    import pandas as pd

    rows = []
    for s in scores:
        row: dict[str, Any] = {"entry": s.label, "score": s.value}
        for t in s.tasks:
            row |= {f"{t['task']} accuracy": t["accuracy"], f"{t['task']} bytes/rank": t["bytes_per_rank"],
                    f"{t['task']} speed": t["speed"]}  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows).set_index("entry")


#: Where a rank's error message turns into its traceback: file paths and line numbers of this install, which
#: would make the same entry's reason differ from machine to machine.
TRACEBACK_MARKS = ("--- traceback", "Traceback (most recent call last)")


def first_lines(text: str, most: int = 600) -> str:
    """The message without its tracebacks, on one line, at most ``most`` characters."""
    for mark in TRACEBACK_MARKS:
        text = text.split(mark)[0]
    text = " ".join(text.split())
    return text if len(text) <= most else text[: most - 1] + "…"

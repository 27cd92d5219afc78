"""The challenge's fixed task sets: which model, how many steps, which seed, on how many ranks and nodes, and the
reference network that turns a run's exact bytes into modelled seconds. Changing any of these changes every score:
bump the set's name.

Two sets: :data:`TASK_SET` (the default, two tasks on two ranks: any laptop) and :data:`NODES_TASK_SET`, which adds
the wide MLP on 2 nodes of 2 ranks (notebook 14's nodes, by name only: each rank knows its node and no link is built,
so it needs no namespaces). There the model times each level apart, and a hook that compresses only between nodes
can beat one that compresses everywhere."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ChallengeTask",
    "NODES_TASK_SET",
    "REFERENCE_NETWORK",
    "ReferenceNetwork",
    "TASK_SET",
    "TASK_SETS",
    "TASKS",
    "task_set_of",
    "tasks_of",
]

#: The task set's name, printed with every score: two scores compare only under the same one.
TASK_SET = "hook-challenge-1"
#: The set with the two-node task too.
NODES_TASK_SET = "hook-challenge-nodes-1"


@dataclass(frozen=True)
class ChallengeTask:
    """One task: the lab's ``model`` trained ``steps`` steps on ``world_size`` ranks from the course's ``seed``,
    on ``nodes`` nodes of consecutive ranks (by name only: no link, :mod:`commhooks_lab.launcher.topology`)."""

    model: str
    steps: int
    seed: int = 0
    world_size: int = 2
    batch_size: int = 32
    nodes: int = 1

    @property
    def name(self) -> str:
        """``wide``, or ``wide, 2 nodes``: how reports and tables name the task."""
        return self.model if self.nodes == 1 else f"{self.model}, {self.nodes} nodes"

    def run_options(self) -> dict:
        """What :func:`commhooks_lab.run` takes for this task (test accuracy at the end only)."""
        return {
            "model": self.model,
            "steps": self.steps,
            "seed": self.seed,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "eval_every": 0,
        } | ({"nodes": self.nodes} if self.nodes > 1 else {})


#: The wide MLP on digits (4.5 MB of float32 gradients: where compression pays) and the CNN (small, many layers).
TASKS: tuple[ChallengeTask, ...] = (ChallengeTask("wide", steps=30), ChallengeTask("cnn", steps=30))
#: Every task set by name. The two-node task is the wide MLP again, on 4 ranks in 2 nodes: 4.5 MB a step to move.
TASK_SETS: dict[str, tuple[ChallengeTask, ...]] = {
    TASK_SET: TASKS,
    NODES_TASK_SET: (*TASKS, ChallengeTask("wide", steps=30, world_size=4, nodes=2)),
}


def tasks_of(tasks: str | Sequence[ChallengeTask]) -> tuple[ChallengeTask, ...]:
    """The tasks of a set named ``tasks`` (refused with the names there are), or ``tasks`` themselves."""
    if not isinstance(tasks, str):
        return tuple(tasks)
    if tasks not in TASK_SETS:
        raise ValueError(f"no task set {tasks!r}: choose one of {', '.join(map(repr, TASK_SETS))}")
    return TASK_SETS[tasks]


def task_set_of(tasks: Sequence[ChallengeTask]) -> str:
    """The name of the set ``tasks`` is, or ``custom: ...`` listing them: scores compare only under one name."""
    tasks = tuple(tasks)
    named = next((name for name, members in TASK_SETS.items() if members == tasks), None)
    return named or "custom: " + "; ".join(f"{t.name} ({t.steps} steps, seed {t.seed})" for t in tasks)


@dataclass(frozen=True)
class ReferenceNetwork:
    """The α/β model's fixed network: every rank behind a ``bandwidth_gbps`` link, ``latency_us`` per ring hop.
    On nodes, each node's uplink is the ``bandwidth_gbps`` link and each rank has ``intra_gbps`` inside its node:
    10 times the uplink, about the ratio in notebook 14's DGX figures (NVLink, 8 x 450 Gbit/s a card, against a
    400 Gbit/s network: 9)."""

    bandwidth_gbps: float = 1.0
    latency_us: float = 5.0
    intra_gbps: float = 10.0

    def describe(self, nodes: bool = False) -> str:
        """The network in words; ``nodes``: with what a task on nodes sees."""
        flat = f"{self.bandwidth_gbps:g} Gbit/s per rank, {self.latency_us:g} µs per hop (α/β model, not measured)"
        if not nodes:
            return flat
        return (
            f"{flat}; on nodes, {self.bandwidth_gbps:g} Gbit/s per node's uplink and {self.intra_gbps:g} Gbit/s per "
            f"rank inside a node, {self.latency_us:g} µs per hop on both"
        )

    def two_level(self, task: ChallengeTask):
        """The two-level network of ``task``'s nodes (:class:`~commhooks_lab.studies.network.TwoLevelNetwork`)."""
        from ..studies.network import TwoLevelNetwork

        return TwoLevelNetwork(
            intra_alpha_us=self.latency_us,
            intra_gbps=self.intra_gbps,
            inter_alpha_us=self.latency_us,
            inter_gbps=self.bandwidth_gbps,
            nodes=task.nodes,
            ranks_per_node=task.world_size // task.nodes,
        )


REFERENCE_NETWORK = ReferenceNetwork()

"""The challenge's fixed task set: which model, how many steps, which seed, and the reference network that turns
a run's exact bytes into modelled seconds. Changing any of these changes every score: bump :data:`TASK_SET`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ChallengeTask", "REFERENCE_NETWORK", "ReferenceNetwork", "TASK_SET", "TASKS"]

#: The task set's name, printed with every score: two scores compare only under the same one.
TASK_SET = "hook-challenge-1"


@dataclass(frozen=True)
class ChallengeTask:
    """One task: the lab's ``model`` trained ``steps`` steps on ``world_size`` ranks from the course's ``seed``."""

    model: str
    steps: int
    seed: int = 0
    world_size: int = 2
    batch_size: int = 32

    def run_options(self) -> dict:
        """What :func:`commhooks_lab.run` takes for this task (test accuracy at the end only)."""
        return {
            "model": self.model,
            "steps": self.steps,
            "seed": self.seed,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "eval_every": 0,
        }


#: The wide MLP on digits (4.5 MB of float32 gradients: where compression pays) and the CNN (small, many layers).
TASKS: tuple[ChallengeTask, ...] = (ChallengeTask("wide", steps=30), ChallengeTask("cnn", steps=30))


@dataclass(frozen=True)
class ReferenceNetwork:
    """The α/β model's fixed network: every rank behind a ``bandwidth_gbps`` link, ``latency_us`` per ring hop."""

    bandwidth_gbps: float = 1.0
    latency_us: float = 5.0

    def describe(self) -> str:
        return f"{self.bandwidth_gbps:g} Gbit/s per rank, {self.latency_us:g} µs per hop (α/β model, not measured)"


REFERENCE_NETWORK = ReferenceNetwork()

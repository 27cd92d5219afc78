"""``run`` one experiment or ``compare`` several: on the session's warm ranks, fresh ones, or your :class:`Cluster`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from typing import Any

from .engine.config import ExperimentConfig
from .engine.dispatch import job_for
from .engine.fsdp2_comm_spec import run_name
from .hooks.choice import HookChoice
from .hooks.powersgd import SHORT_RUN_START
from .launcher import Cluster, Ranks, RankSpec
from .launcher.cluster import serialize_task
from .launcher.link_spec import link_notes
from .launcher.torchrun import launch_from_env, under_torchrun
from .result import Result, ResultSet, from_ranks

__all__ = ["as_config", "as_configs", "assemble_result", "compare", "DEFAULT_COMPARISON", "run"]

#: The main job's line-up: every built-in hook, PowerSGD made to compress within a short run.
DEFAULT_COMPARISON: list[Any] = [
    "allreduce",
    "fp16",
    "bf16",
    f"power_sgd[matrix_approximation_rank=1,start_powerSGD_iter={SHORT_RUN_START}]",
    f"power_sgd[matrix_approximation_rank=4,start_powerSGD_iter={SHORT_RUN_START}]",
    f"batched_power_sgd[matrix_approximation_rank=4,start_powerSGD_iter={SHORT_RUN_START}]",
    "noop",
]

StepCallback = Callable[[int, dict], None]


def as_config(item: Any, base: ExperimentConfig) -> ExperimentConfig:
    """A line-up item as a config: a full ExperimentConfig, a dict of changes to ``base``, or a hook as
    :func:`commhooks_lab.hooks.choice.as_choice` reads it (a name, ``"topk[ratio=0.05]"``, your function,
    a compressor object); ExperimentConfig splits a spec into hook and state_options."""
    if isinstance(item, ExperimentConfig):
        return item
    if isinstance(item, dict):
        return base.replace(**item)
    return base.replace(hook=item)


def as_configs(items: Iterable[Any], base: ExperimentConfig | None, caller: str, **changes) -> list[ExperimentConfig]:
    """A line-up as configs, each item read by :func:`as_config` against ``base`` with ``changes``; an empty one
    is refused, naming ``caller``."""
    base = (base or ExperimentConfig()).replace(**changes)
    configs = [as_config(item, base) for item in items]
    if not configs:
        raise ValueError(f"{caller} needs at least one hook or config")
    return configs


def _never_compressed_note(config: ExperimentConfig, choice: HookChoice, result: Result) -> str | None:
    """A hook that never compressed measured plain allreduce: say so, and why (its registry record knows)."""
    entry = choice.entry
    if entry is None or entry.never_compressed is None or result.steps["compressing"].any():
        return None
    why, fix = entry.never_compressed(choice.options, config.steps)
    return f"{choice.hook} never compressed in {config.steps} steps: {why}. Every number here is plain allreduce. {fix}"


class _Progress:
    """Forwards rank 0's step events; optionally a tqdm bar on stderr (terminals, not nbval)."""

    def __init__(self, total: int, show: bool, on_step: StepCallback | None):
        self.on_step = on_step
        self.bar = None
        if show:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", leave=False)

    def event(self, rank: int, event: dict) -> None:
        if "step" in event:
            if self.bar is not None:
                self.bar.update(1)
            if self.on_step is not None:
                self.on_step(rank, event)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _task(config: ExperimentConfig, choice: HookChoice) -> bytes:
    """The run as the bytes the ranks receive: a hook that cannot travel is refused here, before any rank starts."""
    return serialize_task(job_for(config), (config, choice))


def _on_ranks(task: bytes, spec: RankSpec, ranks: Ranks, progress: _Progress) -> tuple[list, str]:
    """The ranks' values for one run's ``task``, and how those ranks were started."""
    cluster = ranks(spec)
    # another timeout only on a cluster of yours
    timeout_s = None if cluster.spec.timeout_s == spec.timeout_s else spec.timeout_s
    values = cluster.run_serialized(task, timeout_s=timeout_s, on_event=progress.event)
    return values, cluster.spec.start_method


def _checked(config: ExperimentConfig) -> tuple[HookChoice, RankSpec]:
    """Every check of ``config``, and the ranks it runs on: refused here, before any rank starts."""
    choice, spec = config.checked()
    assert spec is not None  # checked for ranks the lab starts on this machine
    return choice, spec


def assemble_result(
    config: ExperimentConfig, choice: HookChoice, ranks: list[dict], start_method: str, spec: RankSpec | None = None
) -> Result:
    """The ranks' return values as one Result, with the notes only the whole run can tell (``spec``: the ranks it
    ran on, behind its link; None under torchrun)."""
    record = config.to_dict()
    result = from_ranks({**record, "name": config.label or run_name(choice.name, config.fsdp2_comm)}, ranks)
    result.env["start_method"] = start_method
    note = _never_compressed_note(config, choice, result)
    if note:
        result.notes.append(note)
    result.notes.extend(link_notes(spec.link, spec.topology) if spec is not None else [])
    return result


def run(
    config: ExperimentConfig | None = None,
    cluster: Cluster | None = None,
    *,
    fresh: bool = False,
    progress: bool = False,
    on_step: StepCallback | None = None,
    **changes,
) -> Result:
    """Run one experiment: ``run(hook="fp16", steps=10)``.

    It runs on the session's warm ranks (:mod:`commhooks_lab.launcher.session`), on ``cluster`` if you pass
    one, or on new ranks started for it and stopped after it with ``fresh=True``.
    """
    config = (config or ExperimentConfig()).replace(**changes)
    choice, spec = _checked(config)
    with contextlib.ExitStack() as stack:
        bar = _Progress(config.steps, progress, on_step)
        stack.callback(bar.close)
        task = _task(config, choice)
        ranks = stack.enter_context(Ranks(cluster, fresh=fresh))
        values, start_method = _on_ranks(task, spec, ranks, bar)
        return assemble_result(config, choice, values, start_method, spec)


def compare(
    items: Iterable[Any] | None = None,
    base: ExperimentConfig | None = None,
    cluster: Cluster | None = None,
    *,
    fresh: bool = False,
    progress: bool = False,
    on_step: StepCallback | None = None,
    **changes,
) -> ResultSet:
    """Run several hooks (names, ``"topk[ratio=0.05]"`` specs, dicts of changes, or configs) on the same
    task, one after another.

    Every config is checked before any rank runs. The runs go to the session's warm ranks, to
    ``cluster``, or with ``fresh=True`` to new ranks (started once per world size, stopped at the end).
    Under torchrun the ranks are given: every rank calls ``compare``, the configs run in its one
    process group (the world size is torchrun's), and rank 0 gets the results, the others ``None``.
    """
    configs = as_configs(DEFAULT_COMPARISON if items is None else items, base, "compare", **changes)
    if under_torchrun():
        return _compare_under_torchrun(configs, cluster, fresh)  # type: ignore[return-value]
    checked = [_checked(config) for config in configs]
    tasks = [_task(config, choice) for config, (choice, _) in zip(configs, checked)]
    results = ResultSet()
    with contextlib.ExitStack() as stack:
        ranks = stack.enter_context(Ranks(cluster, fresh=fresh))
        bar = _Progress(sum(c.steps for c in configs), progress, on_step)
        stack.callback(bar.close)
        for config, (choice, spec), task in zip(configs, checked, tasks):
            values, start_method = _on_ranks(task, spec, ranks, bar)
            results.append(assemble_result(config, choice, values, start_method, spec))
    return results


def _compare_under_torchrun(configs: list[ExperimentConfig], cluster: Cluster | None, fresh: bool) -> ResultSet | None:
    """Every config in this torchrun process group; rank 0 assembles the results."""
    if cluster is not None or fresh:
        raise ValueError("under torchrun the ranks are given: drop cluster= and fresh=")
    from .engine.dispatch import run_configs

    configs = [c.replace(world_size=int(os.environ["WORLD_SIZE"])) for c in configs]
    choices = [config.check(local=False) for config in configs]  # every typo, before the first collective
    per_rank = launch_from_env(run_configs, configs, choices)
    if per_rank is None:  # not rank 0: rank 0 reports
        return None
    return ResultSet(
        assemble_result(config, choice, [runs[i] for runs in per_rank], "torchrun")
        for i, (config, choice) in enumerate(zip(configs, choices))
    )

"""``run`` one experiment or ``compare`` several, on fresh ranks or a warm :class:`Cluster`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from ._compat import power_sgd_defaults
from .config import ExperimentConfig
from .fsdp2 import fsdp2_job
from .hooks import HookChoice
from .launcher import Cluster, launch
from .rank_job import run_experiment
from .result import Result, ResultSet, from_ranks

#: The main job's line-up: every built-in hook, PowerSGD made to compress within a short run.
DEFAULT_COMPARISON: list[Any] = [
    "allreduce",
    "fp16",
    "bf16",
    {"hook": "power_sgd", "state_options": {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}},
    {"hook": "power_sgd", "state_options": {"matrix_approximation_rank": 4, "start_powerSGD_iter": 2}},
    {"hook": "batched_power_sgd", "state_options": {"matrix_approximation_rank": 4, "start_powerSGD_iter": 2}},
    "noop",
]

StepCallback = Callable[[int, dict], None]


def as_config(item: Any, base: ExperimentConfig) -> ExperimentConfig:
    """A hook name, a dict of changes to ``base``, or a full ExperimentConfig."""
    if isinstance(item, ExperimentConfig):
        return item
    if isinstance(item, dict):
        return base.replace(**item)
    return base.replace(hook=item)


def never_compressed_note(config: ExperimentConfig, choice: HookChoice, result: Result) -> str | None:
    """PowerSGD that never compressed measures plain allreduce: say so, and why."""
    if not choice.is_power_sgd() or result.steps["compressing"].any():
        return None
    options = {**power_sgd_defaults(), **choice.options}
    start = options["start_powerSGD_iter"]
    if start >= config.steps:
        default = " (PyTorch's default)" if "start_powerSGD_iter" not in choice.options else ""
        why = (
            f"start_powerSGD_iter={start}{default} >= steps={config.steps}, and PowerSGD runs plain "
            "allreduce before that step"
        )
        fix = "Set state_options={'start_powerSGD_iter': 2} (Accelerate: comm_state_option) to compress."
    else:
        rate = options["min_compression_rate"]
        why = f"no gradient matrix passed min_compression_rate={rate} at this rank"
        fix = "Lower min_compression_rate or matrix_approximation_rank to compress."
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


def _run_checked(config: ExperimentConfig, choice: HookChoice, cluster: Cluster | None, progress: _Progress) -> Result:
    worker = fsdp2_job if config.api == "fsdp2" else run_experiment
    if cluster is None:
        ranks = launch(
            worker,
            config,
            choice,
            world_size=config.world_size,
            backend=config.backend,
            timeout_s=config.timeout_s,
            on_event=progress.event,
        )
    else:
        if cluster.world_size != config.world_size:
            raise ValueError(
                f"this Cluster has {cluster.world_size} ranks but the config asks for "
                f"world_size={config.world_size}; make the Cluster with world_size={config.world_size}"
            )
        ranks = cluster.run(worker, config, choice, timeout_s=config.timeout_s, on_event=progress.event)
    return assemble_result(config, choice, ranks, cluster.start_method if cluster is not None else "spawn")


def assemble_result(config: ExperimentConfig, choice: HookChoice, ranks: list[dict], start_method: str) -> Result:
    """The ranks' return values as one Result, with the notes only the whole run can tell."""
    result = from_ranks({**config.to_dict(), "name": config.label or choice.name}, ranks)
    result.env["start_method"] = start_method
    note = never_compressed_note(config, choice, result)
    if note:
        result.notes.append(note)
    return result


def run(
    config: ExperimentConfig | None = None,
    cluster: Cluster | None = None,
    *,
    progress: bool = False,
    on_step: StepCallback | None = None,
    **changes,
) -> Result:
    """Run one experiment: ``run(hook="fp16", steps=10)`` or ``run(config, cluster=warm_cluster)``."""
    config = (config or ExperimentConfig()).replace(**changes)
    choice = config.check()
    bar = _Progress(config.steps, progress, on_step)
    try:
        return _run_checked(config, choice, cluster, bar)
    finally:
        bar.close()


def compare(
    items: Iterable[Any] | None = None,
    base: ExperimentConfig | None = None,
    cluster: Cluster | None = None,
    *,
    progress: bool = False,
    on_step: StepCallback | None = None,
    **changes,
) -> ResultSet:
    """Run several hooks (names, dicts of changes, or configs) on the same task; one start-up for all.

    Every config is checked before any process starts. Without a ``cluster`` the ranks are
    started once per world size and closed at the end.
    """
    base = (base or ExperimentConfig()).replace(**changes)
    configs = [as_config(item, base) for item in (DEFAULT_COMPARISON if items is None else items)]
    if not configs:
        raise ValueError("compare needs at least one hook or config")
    choices = [config.check() for config in configs]
    bar = _Progress(sum(c.steps for c in configs), progress, on_step)
    results = ResultSet()
    with contextlib.ExitStack() as stack:
        stack.callback(bar.close)
        clusters: dict[tuple, Cluster] = {}
        for config, choice in zip(configs, choices):
            use = cluster
            if use is None:
                key = (config.world_size, config.backend)
                if key not in clusters:
                    clusters[key] = stack.enter_context(
                        Cluster(config.world_size, backend=config.backend, timeout_s=config.timeout_s)
                    )
                use = clusters[key]
            results.append(_run_checked(config, choice, use, bar))
    return results

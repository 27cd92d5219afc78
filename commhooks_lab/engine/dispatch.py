"""Which job a rank runs for a config: the DDP loop (``api='torch'``/``'accelerate'``) or FSDP2's."""

from __future__ import annotations

from collections.abc import Callable

from ..hooks.choice import HookChoice
from .config import ExperimentConfig
from .ddp_job import ddp_job
from .fsdp2 import fsdp2_job

__all__ = ["job_for", "run_configs"]


def job_for(config: ExperimentConfig) -> Callable[..., dict]:
    """``job(ctx, config, choice) -> the rank's report``, the same call shape for every api."""
    return fsdp2_job if config.api == "fsdp2" else ddp_job


def run_configs(ctx, configs: list[ExperimentConfig], choices: list[HookChoice]) -> list[dict]:
    """Several experiments in one process group (under torchrun, where re-joining is costly)."""
    return [job_for(config)(ctx, config, choice) for config, choice in zip(configs, choices)]

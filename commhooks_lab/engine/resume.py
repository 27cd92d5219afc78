"""The rank side of a checkpoint: what a rank saves at step k, and how a new rank picks it up.

Resuming bit for bit takes more than the model: the optimizer's momentum, where each rank is in
its data, torch's global RNG (a DataLoader draws from it once per epoch), the probe's running
sums (``cumulative_rel_error`` covers the whole run) and the hook's own memory. One more thing
hides in DDP: after the first iteration it rebuilds its buckets in the order gradients arrived,
so a hook state saved at step k is laid out for the rebuilt buckets, while a new DDP model's
first step uses the initial ones. A resumed rank therefore runs one throwaway backward (the hook
skipped, the gradients dropped, the weights restored after it) so that its buckets are rebuilt
before the first real step, as they were in the run that saved.
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from ..launcher.errors import OtherRankFailed
from . import checkpoint
from .config import ExperimentConfig
from .hook_state_fit import HookStateMismatch, check_bucket_memory_fits, check_residuals_fit

__all__ = ["resume_rank", "save_checkpoint"]


def save_checkpoint(ctx, config: ExperimentConfig, step: int, setup, task, probe, rows: tuple[list, list]) -> None:
    """Every rank writes its files after ``step`` steps (call right after a probe flush); rank 0 the run's."""
    assert config.checkpoint_dir is not None
    params = list(task.model.parameters())
    tree = {
        "step": step,
        "model": task.model.state_dict(),
        "optimizer": setup.optimizer.state_dict(),
        "hook_state": checkpoint.hook_state_dict(setup.state, params),
        "hook_state_type": type(setup.state).__name__,
        "probe": probe.state_dict() if config.measure else None,
        "torch_rng": torch.get_rng_state(),
    }
    shared = [uuid.uuid4().hex if ctx.is_main else ""]
    dist.broadcast_object_list(shared, src=0)  # one id for every rank's files and run.json: a mix is caught
    save_id = str(shared[0])
    staged, error = [], None
    try:
        staged = checkpoint.stage_rank(config.checkpoint_dir, ctx.rank, tree, save_id)
    except Exception as exc:  # told to every rank first: a rank that raised here alone would leave them waiting
        error = exc
    failed: list = [None] * ctx.world_size
    dist.all_gather_object(failed, error is not None)
    if any(failed):  # the folder keeps its last save whole: no rank puts its new files in place
        checkpoint.discard(staged)
        if error is not None:
            raise error
        ranks = ", ".join(str(r) for r, f in enumerate(failed) if f)
        raise OtherRankFailed(f"rank {ranks} could not write its checkpoint files; the last save is kept")
    checkpoint.commit(staged)
    dist.barrier()  # run.json last: its presence means every rank's files are complete
    if ctx.is_main:
        steps, layers = rows
        checkpoint.write_run(
            config.checkpoint_dir,
            {
                "config": config.to_dict(),
                "save_id": save_id,
                "step": step,
                "world_size": ctx.world_size,
                "hook_state_type": tree["hook_state_type"],
                "steps": steps,
                "layers": layers,
                "torch": torch.__version__,
            },
        )


def _rebuild_buckets(setup, task, probe, loss_fn, batch) -> None:
    """One backward with the hook skipped, so DDP's buckets are the rebuilt ones from the first real step."""
    x, y = (t.to(probe.device) for t in batch)
    probe.passthrough = True
    try:
        loss = loss_fn(setup.model(x), y)
        setup.backward(loss)
    finally:
        probe.passthrough = False
    setup.optimizer.zero_grad(set_to_none=True)


def resume_rank(ctx, config: ExperimentConfig, setup, task, probe, loss_fn) -> tuple[int, list, list, list[str]]:
    """Load this rank's checkpoint into a freshly set-up run; returns (next step, step rows, layer rows, notes)."""
    assert config.resume_from is not None
    folder = Path(config.resume_from)
    saved = checkpoint.load_rank(folder, ctx.rank, ctx.device)
    start = saved["step"]
    for _ in range(start):  # the data each rank already trained on
        next(setup.batches)
    first = next(setup.batches)
    setup.batches = itertools.chain([first], setup.batches)
    _rebuild_buckets(setup, task, probe, loss_fn, first)
    task.model.load_state_dict(saved["model"])
    setup.optimizer.load_state_dict(saved["optimizer"])
    _check_optimizer_shapes(setup.optimizer, checkpoint.rank_file(folder, ctx.rank))
    if saved["probe"] is not None:
        probe.load_state_dict(saved["probe"])
    params = list(task.model.parameters())
    if config.resume_hook_state:
        _load_hook_state(setup.state, saved["hook_state"], params, probe, checkpoint.rank_file(folder, ctx.rank))
    torch.set_rng_state(saved["torch_rng"])
    notes = [_resume_note(config, start, saved)]
    meta = checkpoint.read_run(folder) if ctx.is_main else {}  # the rows measured so far: rank 0 reports them
    return start, meta.get("steps", []), meta.get("layers", []), notes


def _check_optimizer_shapes(optimizer, where: Path) -> None:
    """Every per-parameter tensor of the loaded optimizer state has its parameter's shape: load_state_dict takes
    any shape, and a wrong one (a hand-edited file, another model's) failed later as a bare broadcast error."""
    for group in optimizer.param_groups:
        for position, param in enumerate(group["params"]):
            for key, value in optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                    raise checkpoint.CheckpointError(
                        f"{where}: the optimizer's {key!r} for parameter {position} has shape {tuple(value.shape)}, "
                        f"the parameter {tuple(param.shape)} (edited by hand, or another model's): save it again"
                    )


def _load_hook_state(state, saved, params: list, probe, where: Path) -> None:
    """The hook's memory back in its state, refused by name if a saved tensor cannot fit this model
    (a hand-edited file, another model's), instead of a bare broadcast or view error inside the hook."""

    def named(check, *args) -> None:
        try:
            check(*args)
        except HookStateMismatch as error:
            raise checkpoint.CheckpointError(
                f"{where}: {error} (edited by hand, or another model's): save it again, or resume with "
                "resume_hook_state=False to start the hook's memory empty"
            ) from None

    checkpoint.load_hook_state(state, saved, params)
    named(check_residuals_fit, state, params)
    probe.first_step_check = lambda state, bucket: named(check_bucket_memory_fits, state, bucket)


def _resume_note(config: ExperimentConfig, start: int, saved: dict) -> str:
    """Say what this run restored, and what it dropped."""
    where = f"resumed from {config.resume_from} at step {start} (a new DDP model, loaded from the files)"
    if saved["hook_state"] is None:
        return f"{where}; this hook keeps no state between steps."
    kept = _describe_state(saved["hook_state"])
    if config.resume_hook_state:
        return f"{where}, with the hook state ({saved['hook_state_type']}: {kept})."
    return (
        f"{where}, WITHOUT the hook state: a new {saved['hook_state_type']} started empty and lost {kept}. "
        "Model, optimizer, data position and RNG were restored."
    )


def _describe_state(tree) -> str:
    """A hook state in a few words: its counters and how many tensors of memory it held."""
    if not isinstance(tree, dict):
        return type(tree).__name__
    parts = []
    for key, value in tree.items():
        if isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()):
            parts.append(f"{key} ({len(value)} tensors, {sum(v.numel() for v in value.values())} numbers)")
        elif isinstance(value, int) and (key == "iter" or key.startswith("step")):  # step counters
            parts.append(f"{key}={value}")
    return ", ".join(parts) or "no memory"

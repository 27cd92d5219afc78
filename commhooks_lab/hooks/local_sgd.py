"""Communicate less often: local SGD, PyTorch's post-local SGD, and DiLoCo (every ``sync_every`` steps).

Every other family in this package communicates every step. These let each rank step on its own
gradient (DDP's hook sends nothing) and synchronise every ``H = sync_every`` optimizer steps:

- ``local_sgd``: average the parameters (one all-reduce of the model, divided by W);
- ``post_local_sgd``: PyTorch's ``post_localSGD_hook`` (global all-reduce for ``start_localSGD_iter``
  steps, then each rank's own subgroup) with its ``PeriodicModelAverager`` (period H). PyTorch
  builds the subgroups with ``dist.new_subgroups()``, whose default size is the number of GPUs per
  machine (without one it raises ValueError: "Default group size only takes effect when CUDA is available",
  "CUDA/XPU" from torch 2.14); on CPU the lab passes subgroups of one rank explicitly, so after the warm-up each
  rank steps alone between averages;
- ``diloco``: H inner optimizer steps, then the *pseudo-gradient* Δ = θ_global − θ_local is
  averaged over ranks (in float32, or cast to 16 bits first: ``compress``) and an outer SGD step with
  Nesterov momentum moves θ_global by it (Douillard et al., arXiv 2311.08105; ``torchft/local_sgd.py``); the outer
  update can also go through the lab's int8 codes (INTELLECT-1 quantises to int8 but all-reduces) or top-k 1% with
  error feedback (as SparseLoCo), ``compress="int8"|"topk"``, both all-gathered here.

Each attaches to the optimizer as torchft's ``LocalSGD`` and ``DiLoCo`` do (``torchft/local_sgd.py``): the record's
``step_post_hook(model, optimizer, options, count)`` registers a step post-hook (``optimizer.register_step_post_hook``)
that counts the optimizer's steps and synchronises after every H-th, so the training loop never knows. ``count(fn)``
runs the synchronisation and adds the bytes of its collectives to that step's row (``fn(uncounted)``, where
``uncounted()`` hides a reference computation), so bytes mean the same as for every other hook. DiLoCo's reference
(the float64 mean behind ``outer_rel_error``) runs only when the run measures: with ``measure=False`` its column is NaN
and a sync sends the method's bytes alone.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable
from typing import Any

from .registry import HOOK, HookEntry, register

__all__ = ["attach", "COMPRESS", "DiLoCo", "LocalSGD", "PostLocalSGD"]

_WHY_NOT_COMPILED = "it steps on each rank's own gradient and synchronises parameters outside backward"


def _check_sync_every(options: dict) -> None:
    every = options.get("sync_every", 4)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"sync_every must be an int >= 1 (optimizer steps between synchronisations), got {every!r}")


def _local_steps(options: dict, process_group: Any) -> tuple:
    """Between synchronisations DDP's hook sends nothing: each rank keeps its own gradient."""
    from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks

    return debugging_hooks.noop_hook, process_group


def attach(syncer: Any, optimizer: Any, count: Callable[[Callable[..., dict]], None] | None = None) -> Any:
    """Register ``syncer.after_step`` as ``optimizer``'s step post-hook, numbering the optimizer's steps from 0 as
    torchft's ``_step_post_hook`` does; ``count(fn)`` runs each call so its bytes land in the step's row (without it,
    the call runs as it is). Returns the hook's handle (``handle.remove()`` detaches it)."""
    steps = itertools.count()

    def step_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        step = next(steps)
        if count is None:
            syncer.after_step(step)
        else:
            count(lambda uncounted: syncer.after_step(step, uncounted))

    return optimizer.register_step_post_hook(step_post_hook)


def _attaching(family: Callable[[Any, Any, dict], Any]) -> Callable[..., Any]:
    """A record's ``step_post_hook``: build the family's syncer in the rank and attach it to the run's optimizer."""

    def step_post_hook(model: Any, optimizer: Any, options: dict, count: Any = None) -> Any:
        return attach(family(model, optimizer, options), optimizer, count)

    return step_post_hook


class LocalSGD:
    """Average the parameters over all ranks after every ``sync_every``-th optimizer step."""

    def __init__(self, model: Any, optimizer: Any, options: dict):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.every = options.get("sync_every", 4)

    def after_step(self, step: int, uncounted: Any = contextlib.nullcontext) -> dict:
        import torch
        import torch.distributed as dist

        if (step + 1) % self.every:
            return {"synced": False}
        with torch.no_grad():
            flat = torch.cat([p.reshape(-1) for p in self.params])
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
            _unflatten_into(self.params, flat)
        return {"synced": True}


def _measuring(uncounted: Any) -> bool:
    """Whether this run measures errors: ``uncounted`` is its probe's ``_uncounted`` (``Probe.count_into``).

    With ``measure=False`` the probe measures nothing, so DiLoCo skips the float64 reference too: its all-reduce
    would double a sync's traffic inside the timed step. Called outside a probe (``nullcontext``), it measures.
    """
    return bool(getattr(getattr(uncounted, "__self__", None), "measure_enabled", True))


def _unflatten_into(params: list, flat: Any) -> None:
    at = 0
    for p in params:
        p.copy_(flat[at : at + p.numel()].view_as(p))
        at += p.numel()


class DiLoCo:
    """Inner steps on each rank; every ``sync_every`` steps an outer Nesterov step on the averaged pseudo-gradient."""

    def __init__(self, model: Any, optimizer: Any, options: dict):
        import torch

        self.params = [p for p in model.parameters() if p.requires_grad]
        self.every = options.get("sync_every", 4)
        compress = options.get("compress", "none")
        dtypes = {"none": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        self.dtype = dtypes.get(compress)
        self.compressed = None  # int8 or top-k with error feedback: the lab's compressors, all-gathered
        if compress in _COMPRESSORS:
            from .compressors import CompressorState

            self.compressed = CompressorState(_COMPRESSORS[compress]())
        self.global_params = [p.detach().clone() for p in self.params]  # θ_global, the same on every rank
        momentum = options.get("outer_momentum", 0.9)
        self.outer = torch.optim.SGD(
            self.global_params, lr=options.get("outer_lr", 0.7), momentum=momentum, nesterov=momentum > 0
        )

    def after_step(self, step: int, uncounted: Any = contextlib.nullcontext) -> dict:
        import torch
        import torch.distributed as dist

        if (step + 1) % self.every:
            return {"synced": False}
        world = dist.get_world_size()
        with torch.no_grad():
            delta = torch.cat([(g - p).reshape(-1) for g, p in zip(self.global_params, self.params)])
            exact = None
            if _measuring(uncounted):  # the exact mean, for the error column only: not part of the method's bytes
                exact = delta.double()
                with uncounted():
                    dist.all_reduce(exact)
                exact /= world
            if self.compressed is None:
                sent = delta.to(self.dtype).div_(world)  # as the 16-bit hooks do: cast, divide, sum
                dist.all_reduce(sent)
                mean = sent.to(torch.float32)
            else:
                from .compressors import average_compressed

                split = delta.split([p.numel() for p in self.params])
                pieces = [d.view_as(p) for d, p in zip(split, self.params)]  # shaped: int8 codes per row
                average_compressed(self.compressed, pieces, self.params)  # writes the means into delta
                mean = delta
            error = math.nan  # not measured: a run with measure=False sends and times the method's bytes only
            if exact is not None:
                error = float((mean.double() - exact).norm() / exact.norm()) if exact.norm() > 0 else 0.0
            at = 0
            for g in self.global_params:
                g.grad = mean[at : at + g.numel()].view_as(g).clone()
                at += g.numel()
            self.outer.step()
            self.outer.zero_grad(set_to_none=True)
            for g, p in zip(self.global_params, self.params):
                p.copy_(g)
        return {"synced": True, "outer_rel_error": error}


class PostLocalSGD:
    """PyTorch's PeriodicModelAverager, after the warm-up of post_localSGD_hook's state."""

    def __init__(self, model: Any, optimizer: Any, options: dict):
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        self.params = list(model.parameters())
        self.averager = PeriodicModelAverager(
            period=options.get("sync_every", 4), warmup_steps=options.get("start_localSGD_iter", 2)
        )

    def after_step(self, step: int, uncounted: Any = contextlib.nullcontext) -> dict:
        synced = _averaged(self.averager.step, self.averager)
        self.averager.average_parameters(self.params)
        return {"synced": synced}


def _averaged(step: int, averager: Any) -> bool:
    """Whether PeriodicModelAverager averaged at this step (its own rule, ``averagers.py``)."""
    return step >= averager.warmup_steps and (step - averager.warmup_steps) % averager.period == 0


#: The process group that :func:`group_of_one` made its groups in, and this rank's group of one.
_ALONE: dict[str, Any] = {}


def group_of_one() -> Any:
    """This rank's process group of one rank, made once per process group and reused by every later run.

    Making it is a collective (``new_subgroups`` makes one group per rank on every rank), and nothing destroys a
    group when a run ends: one per run took a warm rank from 18 to 218 fds and from 8 to 158 threads in 50 runs.
    """
    import torch.distributed as dist

    if _ALONE.get("world") is not dist.group.WORLD:  # a new process group (a restarted rank): new groups
        # explicit subgroups of one rank: new_subgroups() without a size needs a GPU
        _ALONE.update(world=dist.group.WORLD, group=dist.new_subgroups(group_size=1)[0])
    return _ALONE["group"]


def _build_post_local_sgd(options: dict, process_group: Any) -> tuple:
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as p

    state = p.PostLocalSGDState(
        process_group=process_group, subgroup=group_of_one(), start_localSGD_iter=options.get("start_localSGD_iter", 2)
    )
    return p.post_localSGD_hook, state


def _sync_name(name: str):
    def run_name(options: dict) -> str:
        text = f"{name} H={options.get('sync_every', 4)}"
        compress = options.get("compress", "none")
        return text if compress == "none" else f"{text} {compress}"

    return run_name


def _int8():
    from .compressors import Int8PerChannel

    return Int8PerChannel()


def _topk_ef():
    from .compressors import ErrorFeedback, TopK

    return ErrorFeedback(TopK(0.01))


#: DiLoCo's outer update through one of the lab's compressors (all-gathered; top-k keeps its residual across syncs).
_COMPRESSORS = {"int8": _int8, "topk": _topk_ef}
COMPRESS = ("none", "fp16", "bf16", *_COMPRESSORS)


def _check_diloco(options: dict) -> None:
    _check_sync_every(options)
    if options.get("compress", "none") not in COMPRESS:
        raise ValueError(
            f"compress must be one of {list(COMPRESS)} (float32, 16 bits on the wire, 8-bit codes per row, or "
            f"top-k 1% with error feedback), got {options['compress']!r}"
        )
    if not 0 <= options.get("outer_momentum", 0.9) < 1:
        raise ValueError(f"outer_momentum must be in [0, 1), got {options['outer_momentum']!r}")


def _register_synchroniser(name: str, description: str, build, defaults: dict, check, synchroniser) -> None:
    """One record of a family that synchronises from the optimizer's step post-hook: they share the run name,
    the reason they do not compile, and how they attach."""
    register(
        HookEntry(
            name,
            HOOK,
            description,
            build=build,
            defaults=lambda: dict(defaults),
            check=check,
            run_name=_sync_name(name),
            not_compilable=_WHY_NOT_COMPILED,
            step_post_hook=_attaching(synchroniser),
        )
    )


_register_synchroniser(
    "local_sgd",
    "local steps; the parameters averaged every sync_every optimizer steps",
    _local_steps,
    {"sync_every": 4},
    _check_sync_every,
    LocalSGD,
)
_register_synchroniser(
    "post_local_sgd",
    "PyTorch's post_localSGD_hook + PeriodicModelAverager (subgroups of one rank on CPU)",
    _build_post_local_sgd,
    {"sync_every": 4, "start_localSGD_iter": 2},
    _check_sync_every,
    PostLocalSGD,
)
_register_synchroniser(
    "diloco",
    "H inner steps, then an outer Nesterov step on the averaged pseudo-gradient (DiLoCo)",
    _local_steps,
    {"sync_every": 4, "outer_lr": 0.7, "outer_momentum": 0.9, "compress": "none"},
    _check_diloco,
    DiLoCo,
)

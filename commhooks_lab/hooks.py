"""The hook catalogue: names a learner types, checked in the notebook, built inside each rank.

Names follow Accelerate's ``DDPCommunicationHookType`` values (``no``, ``fp16``, ``bf16``,
``power_sgd``, ``batched_power_sgd``) plus ``allreduce`` (PyTorch's Python ``allreduce_hook``)
and ``noop`` (no communication at all). Wrappers are ``no``, ``fp16`` and ``bf16``. A hook
of your own is any ``hook(state, bucket) -> torch.futures.Future[torch.Tensor]``.
"""
from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from ._imports import import_object

HOOKS = ("no", "allreduce", "fp16", "bf16", "power_sgd", "batched_power_sgd", "noop")
WRAPPERS = ("no", "fp16", "bf16")
POWER_SGD_HOOKS = ("power_sgd", "batched_power_sgd")

HOOK_SUMMARIES = {
    "no": "DDP's built-in C++ allreduce (no hook registered)",
    "allreduce": "PyTorch's Python allreduce_hook: the exact average, as a hook",
    "fp16": "cast to float16, divide by world size, allreduce, cast back",
    "bf16": "cast to bfloat16, divide by world size, allreduce, cast back",
    "power_sgd": "rank-r approximation P Q^T of each gradient matrix (Vogels et al. 2019)",
    "batched_power_sgd": "PowerSGD on the whole bucket viewed as one square matrix",
    "noop": "no communication: every rank keeps its own gradient (breaks DDP's invariant)",
}


def _normalize(value: Any) -> Any:
    """Accept Accelerate's enum members (their ``.value`` is the lab's name) and any case."""
    value = getattr(value, "value", value)
    return value.lower() if isinstance(value, str) else value


def _suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def power_sgd_option_names() -> list[str]:
    """``PowerSGDState``'s keyword arguments (read from PyTorch, so they follow its version)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    params = inspect.signature(PowerSGDState.__init__).parameters
    return [p for p in params if p not in ("self", "process_group")]


def resolve_user_hook(hook: Any) -> Callable:
    """A callable, or ``"module:function"`` imported now so a typo fails before any process starts."""
    if isinstance(hook, str) and ":" in hook:
        hook = import_object(hook, "hook")
    if not callable(hook):
        raise ValueError(f"hook must be one of {list(HOOKS)}, a callable hook(state, bucket) or 'module:function'; "
                         f"got {hook!r}")
    try:
        params = list(inspect.signature(hook).parameters)
    except (TypeError, ValueError):
        return hook
    if len(params) != 2:
        raise ValueError(f"a communication hook takes exactly (state, bucket); {getattr(hook, '__name__', hook)} "
                         f"takes {params}")
    return hook


@dataclass(frozen=True)
class HookChoice:
    """A checked choice: which hook, which wrapper, which state options. Picklable."""

    hook: Any  # a name from HOOKS, or a callable
    wrapper: str = "no"
    state_options: tuple = ()  # sorted (key, value) pairs, so the dataclass stays hashable
    state_factory: Any = None  # user hooks: callable(process_group, **state_options) -> state
    label: str | None = None  # a compressor's name

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        base = self.hook if isinstance(self.hook, str) else getattr(self.hook, "__name__", "custom")
        return base if self.wrapper == "no" else f"{self.wrapper}_wrapper({base})"

    @property
    def is_builtin(self) -> bool:
        return isinstance(self.hook, str)

    @property
    def options(self) -> dict:
        return dict(self.state_options)


def check_hook_choice(hook: Any = "allreduce", wrapper: Any = "no", state_options: dict | None = None,
                      state_factory: Callable | None = None) -> HookChoice:
    """Validate before any process starts; every message says what to do instead."""
    from .compressors import Compressor, compressor_hook, make_state

    hook, wrapper = _normalize(hook), _normalize(wrapper)
    options = dict(state_options or {})
    if wrapper is None:
        wrapper = "no"
    if isinstance(hook, Compressor):
        if wrapper not in ("no",):
            raise ValueError(f"the compressor {hook.name} makes its own payload; drop wrapper={wrapper!r}")
        unknown = set(options) - {"seed"}
        if unknown or state_factory is not None:
            raise ValueError(f"a compressor takes only state_options={{'seed': int}}, got {sorted(options)}")
        return HookChoice(compressor_hook, "no", tuple(sorted(options.items())), make_state(hook), hook.name)
    if wrapper not in WRAPPERS:
        raise ValueError(f"unknown wrapper {wrapper!r}; choose one of {list(WRAPPERS)}"
                         f"{_suggest(str(wrapper), WRAPPERS)}")
    if hook is None:
        hook = "no"
    if isinstance(hook, str) and ":" not in hook:
        if hook not in HOOKS:
            raise ValueError(f"unknown hook {hook!r}; choose one of {list(HOOKS)}, or pass your own "
                             f"hook(state, bucket){_suggest(hook, HOOKS)}")
        if wrapper != "no" and hook == "no":
            raise ValueError(f"wrapper={wrapper!r} needs a hook to wrap, and hook='no' registers none "
                             "(Accelerate silently ignores such a comm_wrapper). Use hook='allreduce' or "
                             "'power_sgd' with it, or hook=" + repr(wrapper) + " alone.")
        if hook in POWER_SGD_HOOKS:
            _check_power_sgd_options(options)
        elif options:
            raise ValueError(f"hook {hook!r} keeps no state, so it takes no state_options {sorted(options)}; "
                             f"state_options are PowerSGDState's arguments, for {list(POWER_SGD_HOOKS)}")
        if state_factory is not None:
            raise ValueError("state_factory is for your own hooks; the built-in hooks make their own state")
        return HookChoice(hook, wrapper, tuple(sorted(options.items())))
    hook = resolve_user_hook(hook)
    if options and state_factory is None:
        raise ValueError("state_options for your own hook need a state_factory(process_group, **state_options) "
                         "that builds its state")
    if state_factory is not None and not callable(state_factory):
        raise ValueError(f"state_factory must be callable, got {state_factory!r}")
    return HookChoice(hook, wrapper, tuple(sorted(options.items())), state_factory)


def _check_power_sgd_options(options: dict) -> None:
    known = power_sgd_option_names()
    for key in options:
        if key not in known:
            raise ValueError(f"unknown PowerSGD option {key!r}{_suggest(key, known)} (PowerSGDState takes {known})")
    rank = options.get("matrix_approximation_rank", 1)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"matrix_approximation_rank must be an int >= 1, got {rank!r}: it is the r in the "
                         "rank-r approximation P Q^T")
    start = options.get("start_powerSGD_iter", 1000)
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError(f"start_powerSGD_iter must be an int >= 0, got {start!r}")
    ef, warm = options.get("use_error_feedback", True), options.get("warm_start", True)
    if (ef or warm) and start <= 1:
        raise ValueError(
            f"start_powerSGD_iter={start} with use_error_feedback={ef} and warm_start={warm}: PyTorch refuses this "
            "(ValueError in PowerSGDState). DDP rebuilds its gradient buckets after the first iteration, so the "
            "error and P/Q tensors remembered per bucket would no longer fit. Use start_powerSGD_iter >= 2, or "
            "turn both use_error_feedback and warm_start off."
        )
    min_rate = options.get("min_compression_rate", 2)
    if not isinstance(min_rate, (int, float)) or min_rate < 0:
        raise ValueError(f"min_compression_rate must be a number >= 0, got {min_rate!r}")


# -- inside a rank ---------------------------------------------------------------------------

BF16_HOOK_NAMES = ("bf16_compress_hook", "bf16_compress_wrapper_hook")


def build_hook(choice: HookChoice, process_group=None) -> tuple[Callable | None, Any]:
    """The hook function and its state, as you would pass them to ``register_comm_hook``.

    Returns ``(None, None)`` for ``no``: DDP then uses its built-in allreduce.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    state: Any = process_group
    if not choice.is_builtin:
        hook = choice.hook
        if choice.state_factory is not None:
            state = choice.state_factory(process_group, **choice.options)
    elif choice.hook == "no":
        return None, None
    elif choice.hook in POWER_SGD_HOOKS:
        state = powersgd.PowerSGDState(process_group=process_group, **choice.options)
        hook = powersgd.powerSGD_hook if choice.hook == "power_sgd" else powersgd.batched_powerSGD_hook
        if choice.hook == "batched_power_sgd":
            patch_batched_orthogonalize()
    else:
        hook = {"allreduce": default.allreduce_hook, "fp16": default.fp16_compress_hook,
                "bf16": default.bf16_compress_hook, "noop": debugging_hooks.noop_hook}[choice.hook]
    if choice.wrapper == "fp16":
        hook = default.fp16_compress_wrapper(hook)
    elif choice.wrapper == "bf16":
        hook = default.bf16_compress_wrapper(hook)
    return hook, state


BATCHED_POWER_SGD_NOTE = (
    "batched_power_sgd: PyTorch's batched_powerSGD_hook hands a 2-D matrix to _orthogonalize, which "
    "asserts a 3-D batch (a bare AssertionError on CPU and GPU alike). The lab lets _orthogonalize treat a "
    "2-D matrix as a batch of one (a view: the same numbers in place); 3-D inputs, PowerSGD's own, are "
    "untouched."
)


def batched_orthogonalize_is_broken() -> bool:
    """Does this PyTorch's ``_orthogonalize`` reject the 2-D matrix that batched PowerSGD passes?"""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    try:
        powersgd._orthogonalize(torch.ones(4, 1))
    except AssertionError:
        return True
    return False


def patch_batched_orthogonalize() -> bool:
    """Make batched PowerSGD run where PyTorch's ``_orthogonalize`` only takes batches. Idempotent."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    original = powersgd._orthogonalize
    if batched_fix_active() or not batched_orthogonalize_is_broken():
        return False

    def _orthogonalize(matrices, epsilon=0):
        if matrices.dim() == 2:
            return original(matrices.unsqueeze(0), epsilon)
        return original(matrices, epsilon)

    _orthogonalize._lab_patched = True
    powersgd._orthogonalize = _orthogonalize
    return True


def batched_fix_active() -> bool:
    """Has :func:`patch_batched_orthogonalize` patched this process's PyTorch?"""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    return getattr(powersgd._orthogonalize, "_lab_patched", False)


def registration_refusal(ddp_model, hook: Callable) -> str | None:
    """The error DDP's own ``register_comm_hook`` would raise for this exact hook, or None.

    The lab registers hooks inside a measuring wrapper; this runs DDP's check on the bare hook
    so a learner still sees what their own code would get (e.g. bf16 on a CPU-only build).
    """
    try:
        ddp_model._check_comm_hook(hook)
    except TypeError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def available_hooks():
    """A table of every hook and wrapper: does it run on this machine, and if not, why."""
    import pandas as pd
    import torch

    cuda = torch.cuda.is_available()
    rows = []
    for name in HOOKS:
        runs, why = True, ""
        if name == "bf16" and not cuda:
            why = ("DDP refuses bf16_compress_hook by name on a CPU-only build (TypeError: needs CUDA 11+ and "
                   "NCCL 2.10+); the lab measures the same bf16 arithmetic over gloo and says so")
        if name == "batched_power_sgd" and batched_orthogonalize_is_broken():
            why = "runs with the lab's fix: " + BATCHED_POWER_SGD_NOTE.split(": ", 1)[1]
        rows.append({"kind": "hook", "name": name, "runs_here": runs, "what_it_does": HOOK_SUMMARIES[name],
                     "note": why})
    for name in WRAPPERS[1:]:
        why = ("" if name == "fp16" or cuda
               else "bf16_compress_wrapper is refused by name like bf16; measured all the same")
        rows.append({"kind": "wrapper", "name": name, "runs_here": True,
                     "what_it_does": f"cast the bucket to {name} around any hook", "note": why})
    not_here = {
        "quantization_pertensor_hook": "indexes all_gather results in NCCL's nested layout (IndexError on gloo) and "
                                       "hard-codes .cuda(); the lab's 8-bit quantizer runs on CPU instead",
        "quantization_perchannel_hook": "same as quantization_pertensor_hook",
        "post_localSGD_hook": "needs an explicit subgroup and a PostLocalSGDOptimizer; not a gradient compressor",
        "mixed_precision hooks": "DDP mixed-precision hooks refuse CPU/gloo",
        "ddp_zero_hook": "the ZeRO overlap hook refuses CPU/gloo",
    }
    for name, why in not_here.items():
        rows.append({"kind": "pytorch (not in the lab)", "name": name, "runs_here": False, "what_it_does": "",
                     "note": why})
    return pd.DataFrame(rows)

"""The hook registry: one record per hook, compressor family and wrapper, the facts every consumer needs.

Everything that offers, checks or runs a hook reads this: ``available_hooks()``, the dashboard's
dropdowns, the CLI's and ``compare``'s specs, ``ExperimentConfig.check()``, the training run and
its Accelerate and FSDP2 paths, and the network model's byte rules and overlap. A fact only one
consumer uses lives with that consumer (the dashboard's shown options in :mod:`commhooks_lab.widgets`,
the CLI's ``--matrix-rank`` sweep in :mod:`commhooks_lab.cli`). The records live one family per file,
as PyTorch's ``ddp_comm_hooks/``: :mod:`.default` (no, allreduce, fp16, bf16), :mod:`.debugging` (noop),
:mod:`.wrappers` (the fp16 and bf16 wrappers), :mod:`.powersgd` (power_sgd, batched_power_sgd),
:mod:`.wire16` (the 16-bit ring hooks), :mod:`.compressor_entries` (the lab's compressor families:
topk, randomk, sign, qsgd, terngrad, int8) and :mod:`.local_sgd` (local_sgd, post_local_sgd, diloco).
Names follow Accelerate's ``DDPCommunicationHookType`` values (``no``, ``fp16``, ``bf16``, ``power_sgd``,
``batched_power_sgd``) plus the lab's own; compressor families take their parameter and ``error_feedback``
as state options. To add your own, one record is all it takes::

    from commhooks_lab.hooks.traffic import allreduced, numel

    lab.registry.register(lab.registry.HookEntry(
        name="my_hook", kind="hook", summary="what it does",
        build=lambda options, process_group: (my_hook, process_group),
        # optional: its byte rule for the network model, here every float32 gradient entry all-reduced
        traffic=lambda shapes, buckets, options: allreduced(4 * sum(numel(s) for s in shapes), buckets),
    ))

A record travels to the ranks with the run (by value, so one defined in a notebook works).
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .traffic import Shape, Traffic

__all__ = [
    "check_options",
    "entries",
    "get",
    "hook_names",
    "HookEntry",
    "key",
    "register",
    "unregister",
    "wrapper_names",
]

HOOK, COMPRESSOR, WRAPPER = "hook", "compressor", "wrapper"

Builder = Callable[[dict, Any], tuple]  # (state options, process group) -> (hook or None, state)


@dataclass(frozen=True)
class HookEntry:
    """What the lab knows about one hook, compressor family or wrapper."""

    name: str
    kind: str  # HOOK | COMPRESSOR | WRAPPER
    summary: str
    build: Builder | None = None  # hooks and compressors: options, process_group -> (hook, state)
    wrap: Callable[[Callable], Callable] | None = None  # wrappers: hook -> wrapped hook
    defaults: Callable[[], dict] = dict  # the state options it takes, with their defaults
    check: Callable[[dict], None] | None = None  # refuses bad state options with a useful message
    run_name: Callable[[dict], str] | None = None  # a name that tells runs with other options apart
    accelerate: str | None = None  # its DDPCommunicationHookType value, if Accelerate names it
    needs: str = ""  # what it needs beyond gloo on CPU to register as written
    prepare: Callable[[], Any] | None = None  # run in the rank before the hook is registered (any api)
    rank_note: Callable[[], str | None] | None = None  # a note only the rank can tell, after build
    not_compilable: str = ""  # why it cannot run under compiled autograd (empty: it takes the (grad, param) form)
    #: the byte rule: (parameter shapes, buckets, state options) -> what one rank hands to collectives
    #: in a step where it compresses (None: no rule; the network model says so)
    traffic: Callable[[Sequence[Shape], int, dict], Traffic] | None = None
    overlaps_backward: bool = False  # starts its collective and returns: DDP hides it behind backward
    fsdp2_reduce_dtype: str | None = None  # the torch dtype api='fsdp2' reduces in for this name
    short_run: Callable[[], dict] = dict  # what the lab's short runs set unless told (PowerSGD: start at step 2)
    never_compressed: Callable[[dict, int], tuple[str, str]] | None = None  # (options, steps) -> (why, fix)
    #: communicates around the optimizer step too (local SGD, DiLoCo): (model, optimizer, options, count) registers
    #: its hook with ``optimizer.register_step_post_hook`` and returns the handle; ``count(fn)`` runs ``fn(uncounted)``
    #: and adds the bytes it hands to collectives, and the columns it returns, to the step's row
    step_post_hook: Callable[[Any, Any, dict, Callable], Any] | None = None

    def options_with_defaults(self, options: dict) -> dict:
        return {**self.defaults(), **options}

    def short_run_options(self, options: dict) -> dict:
        """``options`` over the lab's short-run defaults: what the CLI's sweep and the compile matrix run."""
        return {**self.short_run(), **options}


_REGISTRY: dict[str, HookEntry] = {}


def register(entry: HookEntry, *, replace: bool = False) -> HookEntry:
    """Add ``entry``; it then shows in ``available_hooks()``, the CLI and the dashboard."""
    if entry.kind not in (HOOK, COMPRESSOR, WRAPPER):
        raise ValueError(f"kind must be {HOOK!r}, {COMPRESSOR!r} or {WRAPPER!r}, got {entry.kind!r}")
    if (entry.kind == WRAPPER) != (entry.wrap is not None) or (entry.kind != WRAPPER) != (entry.build is not None):
        raise ValueError("a wrapper needs wrap= (and no build=); a hook or compressor needs build= (and no wrap=)")
    if not replace and _key(entry.kind, entry.name) in _REGISTRY:
        raise ValueError(f"{entry.kind} {entry.name!r} is registered already; pass replace=True to change it")
    _REGISTRY[_key(entry.kind, entry.name)] = entry
    return entry


def unregister(name: str, kind: str = HOOK) -> None:
    _REGISTRY.pop(_key(kind, name), None)


def key(entry: HookEntry) -> str:
    """The name an entry is stored (and reported) under: wrappers as ``wrapper:<name>``."""
    return _key(entry.kind, entry.name)


def _key(kind: str, name: str) -> str:
    return f"wrapper:{name}" if kind == WRAPPER else name


def entries(*kinds: str) -> list[HookEntry]:
    """Registered records, in registration order, of the given kinds (default: all)."""
    return [e for e in _REGISTRY.values() if not kinds or e.kind in kinds]


def hook_names() -> list[str]:
    """Everything that can be passed as ``hook=``: hooks, then compressor families."""
    return [e.name for e in entries(HOOK)] + [e.name for e in entries(COMPRESSOR)]


def wrapper_names() -> list[str]:
    return [e.name for e in entries(WRAPPER)]


def _suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def get(name: str, kind: str = HOOK) -> HookEntry:
    """The record for ``name``; ``kind=WRAPPER`` for wrappers. A ValueError lists the choices."""
    entry = _REGISTRY.get(_key(kind, name))
    if entry is None or (entry.kind == WRAPPER) != (kind == WRAPPER):
        choices = wrapper_names() if kind == WRAPPER else hook_names()
        what = "wrapper" if kind == WRAPPER else "hook"
        raise ValueError(f"unknown {what} {name!r}; choose one of {choices}{_suggest(name, choices)}")
    return entry


def check_options(entry: HookEntry, options: dict) -> None:
    """Unknown names and wrong types first (for every entry), then the entry's own rules."""
    defaults = entry.defaults()
    if options and not defaults:
        raise ValueError(f"{entry.kind} {entry.name!r} keeps no state, so it takes no state_options {sorted(options)}")
    for key, value in options.items():
        if key not in defaults:
            raise ValueError(
                f"unknown option {key!r} for {entry.name}{_suggest(key, defaults)} (it takes {sorted(defaults)})"
            )
        default = defaults[key]
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ValueError(f"{entry.name} option {key} must be True or False, got {value!r}")
        if (
            isinstance(default, numbers.Real)
            and not isinstance(default, bool)
            and (isinstance(value, bool) or not isinstance(value, numbers.Real))
        ):
            raise ValueError(f"{entry.name} option {key} must be a number, got {value!r}")
    if entry.check is not None:
        entry.check(options)

"""A hook choice: what a learner typed, checked in the notebook, built inside each rank.

What the names mean lives in :mod:`commhooks_lab.hooks.registry`. A hook of your own is any
``hook(state, bucket) -> torch.futures.Future[torch.Tensor]``; a compressor object from
:mod:`commhooks_lab.hooks.compressors` works too.
"""

from __future__ import annotations

import inspect
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import _compat
from .._util import import_object
from . import registry
from .registry import HookEntry

__all__ = ["as_choice", "build_hook", "check_hook_choice", "HookChoice", "parse_spec", "split_spec"]


def parse_spec(spec: str) -> tuple[str, dict]:
    """``"topk[ratio=0.05,error_feedback=true]"`` -> ("topk", {"ratio": 0.05, "error_feedback": True}).

    One way to name state options in a line-up, on the command line or in a config; values are read as
    bool, int, float, else text.
    """
    name, bracket, rest = spec.partition("[")
    if not bracket:
        return spec, {}
    if not rest.endswith("]"):
        raise ValueError(f"{spec!r}: options go in one pair of brackets, e.g. 'topk[ratio=0.05,error_feedback=true]'")
    options = {}
    for item in filter(None, rest[:-1].split(",")):
        key, eq, raw = item.partition("=")
        if not eq:
            raise ValueError(f"{spec!r}: write each option as key=value, got {item!r}")
        options[key.strip()] = _parse_value(raw.strip())
    return name.strip(), options


def _parse_value(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def split_spec(hook: Any, state_options: Any = None) -> tuple[Any, Any]:
    """A ``"name[key=value,...]"`` hook as (name, its options merged into ``state_options``); others as given."""
    if not (isinstance(hook, str) and "[" in hook):
        return hook, state_options  # as given: the config's own check says what is wrong with it
    if state_options is not None and not isinstance(state_options, dict):
        raise TypeError(f"state_options must be a dict, got {type(state_options).__name__}")
    options = dict(state_options or {})
    name, spec_options = parse_spec(hook)
    both = sorted(set(spec_options) & set(options))
    if both:
        raise ValueError(f"{hook!r} and state_options both set {both}: say each option once")
    return name, {**spec_options, **options}


def _normalize(value: Any) -> Any:
    """Accept Accelerate's enum members (their ``.value`` is the lab's name) and any case."""
    value = getattr(value, "value", value)
    return value.lower() if isinstance(value, str) else value


def _resolve_user_hook(hook: Any) -> Callable:
    """A callable, or ``"module:function"`` imported now; checked as DDP will check it, so that a
    mistake fails here, before any process starts, and not in every rank."""
    if isinstance(hook, str) and ":" in hook:
        hook = import_object(hook, "hook")
    if not callable(hook):
        raise ValueError(
            f"hook must be one of {registry.hook_names()}, a callable hook(state, bucket) or "
            f"'module:function'; got {hook!r}"
        )
    name = getattr(hook, "__name__", repr(hook))
    try:
        signature = inspect.signature(hook)
    except (TypeError, ValueError):
        return hook  # a builtin without a signature: DDP cannot check it either
    params = list(signature.parameters)
    if len(params) != 2:
        raise ValueError(f"a communication hook takes exactly (state, bucket); {name} takes {params}")
    if params[1] != "bucket":
        raise ValueError(
            f"the second parameter of {name} is named {params[1]!r}; DDP looks the hook's parameter up by "
            f"the name 'bucket' (otherwise every rank fails with a bare KeyError: 'bucket'). Write "
            f"def {name}({params[0]}, bucket)."
        )
    returns = signature.return_annotation
    if isinstance(returns, str):
        raise ValueError(
            f"{name} is annotated to return the string {returns!r} (postponed annotations, as with "
            "`from __future__ import annotations`); DDP compares the annotation object with "
            "torch.futures.Future[torch.Tensor] and refuses a string. Drop the return annotation."
        )
    if returns is not inspect.Signature.empty and not _is_future_annotation(returns):
        raise ValueError(
            f"{name} is annotated to return {returns!r}; a communication hook returns a "
            "torch.futures.Future[torch.Tensor] (drop the annotation or write -> torch.futures.Future[torch.Tensor])"
        )
    error = _compat.comm_hook_check_error(hook)
    if error is not None and not isinstance(error, TypeError):  # TypeError: bf16 by name, measured anyway
        raise ValueError(
            f"DDP's own check refuses {name} at register_comm_hook: {type(error).__name__}: {error}"
        ) from error
    return hook


def _is_future_annotation(annotation: Any) -> bool:
    import torch

    origin = typing.get_origin(annotation) or annotation
    return isinstance(origin, type) and issubclass(origin, torch.futures.Future)


@dataclass(frozen=True)
class HookChoice:
    """A checked choice: which hook, which wrapper, which state options. Picklable."""

    hook: Any  # a registered name, or a callable
    wrapper: str = "no"
    state_options: tuple = ()  # sorted (key, value) pairs, so the dataclass stays hashable
    state_factory: Any = None  # user hooks: callable(process_group, **state_options) -> state
    label: str | None = None  # a compressor object's name
    entry: HookEntry | None = None  # the registry record of a registered name (travels to the ranks)
    wrapper_entry: HookEntry | None = None

    @property
    def name(self) -> str:
        """A run's default name: registered hooks name their options where they tell runs apart."""
        if self.label:
            return self.label
        if self.entry is not None:
            base = self.entry.run_name(self.options) if self.entry.run_name else self.entry.name
        else:
            base = getattr(self.hook, "__name__", "custom")
        return base if self.wrapper == "no" else f"{self.wrapper}_wrapper({base})"

    @property
    def options(self) -> dict:
        return dict(self.state_options)


def check_hook_choice(
    hook: Any = "allreduce",
    wrapper: Any = "no",
    state_options: dict | None = None,
    state_factory: Callable | None = None,
    api: str = "torch",
) -> HookChoice:
    """Validate before any process starts; every message says what to do instead (for this ``api``)."""
    hook, options = split_spec(_normalize(hook), state_options)
    options = dict(options or {})
    wrapper = _normalize(wrapper)
    wrapper_entry = registry.get("no" if wrapper is None else wrapper, registry.WRAPPER)
    # A Compressor instance means its module is loaded; not importing it otherwise keeps torch._dynamo (2-3 s,
    # pulled in by its torch.compiler.disable) out of a kernel's first run.
    compressors = sys.modules.get(f"{__package__}.compressors")
    if compressors is not None and isinstance(hook, compressors.Compressor):
        from .compressors import compressor_hook, make_state

        if wrapper_entry.name != "no":
            raise ValueError(f"the compressor {hook.name} makes its own payload; drop wrapper={wrapper!r}")
        unknown = set(options) - {"seed"}
        if unknown or state_factory is not None:
            raise ValueError(f"a compressor takes only state_options={{'seed': int}}, got {sorted(options)}")
        return HookChoice(compressor_hook, "no", tuple(sorted(options.items())), make_state(hook), hook.name)
    if hook is None:
        hook = "no"
    if isinstance(hook, str) and ":" not in hook:
        entry = registry.get(hook)
        if wrapper_entry.name != "no" and entry.kind == registry.COMPRESSOR:
            raise ValueError(f"the compressor {hook} makes its own payload; drop wrapper={wrapper!r}")
        if wrapper_entry.name != "no" and hook == "no":
            wrappable = "hook='power_sgd'" if api == "accelerate" else "hook='allreduce' or 'power_sgd'"
            raise ValueError(
                f"wrapper={wrapper!r} needs a hook to wrap, and hook='no' registers none "
                f"(Accelerate silently ignores such a comm_wrapper). Use {wrappable} with it, "
                f"or hook={wrapper!r} alone."
            )
        registry.check_options(entry, options)
        if state_factory is not None:
            raise ValueError("state_factory is for your own hooks; registered hooks make their own state")
        return HookChoice(
            hook, wrapper_entry.name, tuple(sorted(options.items())), entry=entry, wrapper_entry=wrapper_entry
        )
    hook = _resolve_user_hook(hook)
    if options and state_factory is None:
        raise ValueError(
            "state_options for your own hook need a state_factory(process_group, **state_options) that builds its state"
        )
    if state_factory is not None and not callable(state_factory):
        raise ValueError(f"state_factory must be callable, got {state_factory!r}")
    return HookChoice(
        hook, wrapper_entry.name, tuple(sorted(options.items())), state_factory, wrapper_entry=wrapper_entry
    )


def build_hook(choice: HookChoice, process_group=None) -> tuple[Callable | None, Any]:
    """The hook function and its state, as you would pass them to ``register_comm_hook``.

    Returns ``(None, None)`` for ``no``: DDP then uses its built-in allreduce.
    """
    if choice.entry is not None:
        if choice.entry.prepare is not None:
            choice.entry.prepare()
        assert choice.entry.build is not None  # register() refuses a hook without build=
        hook, state = choice.entry.build(choice.options, process_group)
        if hook is None:
            return None, None
    else:
        hook, state = choice.hook, process_group
        if choice.state_factory is not None:
            state = choice.state_factory(process_group, **choice.options)
    if choice.wrapper_entry is not None and choice.wrapper_entry.wrap is not None:
        hook = choice.wrapper_entry.wrap(hook)
    return hook, state


#: The fields of ExperimentConfig that say which hook runs.
HOOK_FIELDS = ("hook", "wrapper", "state_options", "state_factory")


def as_choice(item: Any) -> HookChoice:
    """One line-up item: a name, a ``"topk[ratio=0.05]"`` spec, a dict of the hook fields, your hook
    function, a compressor object, or a HookChoice. ``run``/``compare`` read the same items
    (through ExperimentConfig, which splits a spec the same way)."""
    if isinstance(item, HookChoice):
        return item
    if isinstance(item, dict):
        unknown = set(item) - set(HOOK_FIELDS)
        if unknown:
            raise ValueError(f"a hook dict takes {', '.join(HOOK_FIELDS)}; got {sorted(unknown)}")
        return check_hook_choice(
            item.get("hook", "allreduce"),
            item.get("wrapper", "no"),
            item.get("state_options"),
            item.get("state_factory"),
        )
    return check_hook_choice(item)

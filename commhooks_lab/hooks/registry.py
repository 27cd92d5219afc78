"""The hook registry: one record per hook, compressor family and wrapper. Add a hook here.

Everything that offers or checks a hook reads this: ``available_hooks()``, the dashboard's
dropdowns, the CLI's choices, ``ExperimentConfig.check()``, the Accelerate path and the
notes a run carries. Names follow Accelerate's ``DDPCommunicationHookType`` values (``no``,
``fp16``, ``bf16``, ``power_sgd``, ``batched_power_sgd``) plus ``allreduce`` and ``noop``;
compressor families (``topk``, ``sign``, ...) take their parameter and ``error_feedback`` as
state options. To add your own::

    lab.registry.register(lab.registry.HookEntry(
        name="my_hook", kind="hook", summary="what it does",
        build=lambda options, process_group: (my_hook, process_group)))

A record travels to the ranks with the run (by value, so one defined in a notebook works).
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import _compat

__all__ = [
    "check_options",
    "entries",
    "get",
    "hook_names",
    "HookEntry",
    "key",
    "parse_hook_spec",
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
    power_sgd: bool = False  # a PowerSGD variant: compresses only from start_powerSGD_iter on
    prepare: Callable[[], Any] | None = None  # run in the rank before the hook is registered (any api)
    rank_note: Callable[[], str | None] | None = None  # a note only the rank can tell, after build
    not_compilable: str = ""  # why it cannot run under compiled autograd (empty: it takes the (grad, param) form)

    def options_with_defaults(self, options: dict) -> dict:
        return {**self.defaults(), **options}


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


def parse_hook_spec(spec: str) -> tuple[str, dict]:
    """``"topk[ratio=0.05,error_feedback=true]"`` -> ("topk", {"ratio": 0.05, "error_feedback": True}).

    The command line's way to pass state options; values are read as bool, int, float, else text.
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


# -- PyTorch's hooks ---------------------------------------------------------------------------------


def _default_hook(attribute: str) -> Builder:
    def build(options: dict, process_group: Any) -> tuple:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        return getattr(default_hooks, attribute), process_group

    return build


def _wrapper(attribute: str) -> Callable[[Callable], Callable]:
    def wrap(hook: Callable) -> Callable:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        return getattr(default_hooks, attribute)(hook)

    return wrap


def _build_noop(options: dict, process_group: Any) -> tuple:
    from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks

    return debugging_hooks.noop_hook, process_group


def _build_power_sgd(attribute: str) -> Builder:
    def build(options: dict, process_group: Any) -> tuple:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        return getattr(powerSGD_hook, attribute), powerSGD_hook.PowerSGDState(process_group=process_group, **options)

    return build


def _check_power_sgd_options(options: dict) -> None:
    """PowerSGDState's own rules, said before any process starts."""
    rank = options.get("matrix_approximation_rank", 1)
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(
            f"matrix_approximation_rank must be an int >= 1, got {rank!r}: it is the matrix rank r "
            "of the approximation P Q^T"
        )
    start = options.get("start_powerSGD_iter", _compat.power_sgd_defaults()["start_powerSGD_iter"])
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"start_powerSGD_iter must be an int >= 0, got {start!r}")
    ef, warm = options.get("use_error_feedback", True), options.get("warm_start", True)
    if (ef or warm) and start <= 1:
        raise ValueError(
            f"start_powerSGD_iter={start} with use_error_feedback={ef} and warm_start={warm}: PyTorch refuses this "
            "(ValueError in PowerSGDState). DDP rebuilds its gradient buckets after the first iteration, so the "
            "error and P/Q tensors remembered per bucket would no longer fit. Use start_powerSGD_iter >= 2, or "
            "turn both use_error_feedback and warm_start off."
        )
    if options.get("min_compression_rate", 2) < 0:
        raise ValueError(f"min_compression_rate must be a number >= 0, got {options['min_compression_rate']!r}")


def _power_sgd_run_name(name: str) -> Callable[[dict], str]:
    """``power_sgd r4``, plus the switches that are off: matrix rank and switches tell runs apart."""

    def run_name(options: dict) -> str:
        text = f"{name} r{options.get('matrix_approximation_rank', 1)}"
        if not options.get("use_error_feedback", True):
            text += " no EF"
        if not options.get("warm_start", True):
            text += " no warm start"
        return text

    return run_name


BATCHED_POWER_SGD_NOTE = (
    "batched_power_sgd: PyTorch's batched_powerSGD_hook hands a 2-D matrix to _orthogonalize, which "
    "asserts a 3-D batch (a bare AssertionError on CPU and GPU alike). The lab lets _orthogonalize treat a "
    "2-D matrix as a batch of one (a view: the same numbers in place); 3-D inputs, PowerSGD's own, are "
    "untouched."
)

#: Why PyTorch's bucket hooks cannot run under compiled autograd (DDP then calls hook(state, (grad, param))).
READS_BUCKET = (
    "PyTorch's {} calls bucket.buffer(), and under compiled autograd DDP passes the tuple (param.grad, param) "
    "instead of a GradBucket"
)
POWER_SGD_NEEDS_BUCKETS = (
    "PowerSGD works on whole buckets: bucket.index() keys its error feedback and warm-start memory and "
    "bucket.is_last() counts its steps, and under compiled autograd DDP passes one (param.grad, param) at a time"
)
WRAPPER_SETS_BUFFER = (
    "{} calls bucket.set_buffer() to cast the bucket, and under compiled autograd DDP passes the tuple "
    "(param.grad, param) instead of a GradBucket"
)

#: DDP checks a bf16 hook's *name* at registration and refuses it on other builds (gloo reduces bf16 fine).
BF16_NEEDS = "CUDA 11+ and NCCL 2.10+ (or XPU with XCCL)"


def _batched_note() -> str | None:
    return BATCHED_POWER_SGD_NOTE if _compat.batched_fix_active() else None


def _register_pytorch_hooks() -> None:
    register(
        HookEntry(
            "no",
            HOOK,
            "DDP's built-in C++ allreduce (no hook registered)",
            build=lambda options, process_group: (None, None),
            accelerate="no",
        )
    )
    register(
        HookEntry(
            "allreduce",
            HOOK,
            "PyTorch's Python allreduce_hook: the exact average, as a hook",
            build=_default_hook("allreduce_hook"),
            not_compilable=READS_BUCKET.format("allreduce_hook"),
        )
    )
    register(
        HookEntry(
            "fp16",
            HOOK,
            "cast to float16, divide by world size, allreduce, cast back",
            build=_default_hook("fp16_compress_hook"),
            accelerate="fp16",
        )
    )
    register(
        HookEntry(
            "bf16",
            HOOK,
            "cast to bfloat16, divide by world size, allreduce, cast back",
            build=_default_hook("bf16_compress_hook"),
            accelerate="bf16",
            needs=BF16_NEEDS,
        )
    )
    for name, attribute, summary in (
        (
            "power_sgd",
            "powerSGD_hook",
            "matrix-rank-r approximation P Q^T of each gradient matrix (Vogels et al. 2019)",
        ),
        ("batched_power_sgd", "batched_powerSGD_hook", "PowerSGD on the whole bucket viewed as one square matrix"),
    ):
        batched = name == "batched_power_sgd"
        register(
            HookEntry(
                name,
                HOOK,
                summary,
                build=_build_power_sgd(attribute),
                defaults=_compat.power_sgd_defaults,
                check=_check_power_sgd_options,
                run_name=_power_sgd_run_name(name),
                accelerate=name,
                power_sgd=True,
                prepare=_compat.patch_batched_orthogonalize if batched else None,
                rank_note=_batched_note if batched else None,
                not_compilable=POWER_SGD_NEEDS_BUCKETS,
            )
        )
    register(
        HookEntry(
            "noop",
            HOOK,
            "no communication: every rank keeps its own gradient (breaks DDP's invariant)",
            build=_build_noop,
            not_compilable=READS_BUCKET.format("noop_hook"),
        )
    )
    register(HookEntry("no", WRAPPER, "no wrapper", wrap=lambda hook: hook, accelerate="no"))
    register(
        HookEntry(
            "fp16",
            WRAPPER,
            "cast the bucket to float16 around any hook",
            wrap=_wrapper("fp16_compress_wrapper"),
            accelerate="fp16",
            not_compilable=WRAPPER_SETS_BUFFER.format("fp16_compress_wrapper"),
        )
    )
    register(
        HookEntry(
            "bf16",
            WRAPPER,
            "cast the bucket to bfloat16 around any hook",
            wrap=_wrapper("bf16_compress_wrapper"),
            accelerate="bf16",
            needs=BF16_NEEDS,
            not_compilable=WRAPPER_SETS_BUFFER.format("bf16_compress_wrapper"),
        )
    )


# -- the lab's compressor zoo -------------------------------------------------------------------------


def _compressor_entry(
    name: str,
    summary: str,
    make: Callable[..., Any],
    parameter: tuple[str, float] | None,
    check: Callable[[dict], None] | None = None,
) -> HookEntry:
    extra = dict([parameter]) if parameter else {}

    def defaults() -> dict:
        return {**extra, "error_feedback": False, "seed": 0}

    def compressor(options: dict):
        from .compressors import ErrorFeedback

        options = {**defaults(), **options}
        inner = make(**{k: options[k] for k in extra})
        return ErrorFeedback(inner) if options["error_feedback"] else inner

    def build(options: dict, process_group: Any) -> tuple:
        from .compressors import CompressorState, compressor_hook

        return compressor_hook, CompressorState(compressor(options), process_group, seed=options.get("seed", 0))

    def check_all(options: dict) -> None:
        if check is not None:
            check(options)
        compressor(options)  # the compressor's own constructor refuses bad parameters

    return HookEntry(
        name,
        COMPRESSOR,
        summary,
        build=build,
        defaults=defaults,
        check=check_all,
        run_name=lambda options: compressor(options).name,
    )


def _register_compressors() -> None:
    from . import compressors as c

    for name, summary, make, parameter in (
        ("topk", "the k = ratio x numel largest entries, values and int32 indices", c.TopK, ("ratio", 0.01)),
        (
            "randomk",
            "k random entries from a seed every rank shares; values only, all-reduced",
            c.RandomK,
            ("ratio", 0.01),
        ),
        (
            "sign",
            "sign(x) x mean|x|: one bit per entry plus one float (EF-SignSGD with error_feedback)",
            c.ScaledSign,
            None,
        ),
        (
            "qsgd",
            "QSGD: norm, sign and a level stochastically rounded to s levels, one byte per entry",
            c.QSGD,
            ("levels", 16),
        ),
        ("terngrad", "TernGrad: max|x| times a random sign in {-1, 0, 1}, one byte per entry", c.TernGrad, None),
        ("int8", "8-bit affine codes with a float32 minimum and step per output channel", c.Int8PerChannel, None),
    ):
        register(_compressor_entry(name, summary, make, parameter))


def _build_wire16(attribute: str) -> Builder:
    def build(options: dict, process_group: Any) -> tuple:
        import torch

        from . import low_precision as low_precision_hooks

        dtype = getattr(torch, options.get("dtype", "bfloat16"))
        return getattr(low_precision_hooks, attribute), low_precision_hooks.Wire16State(dtype, process_group)

    return build


def _check_wire16_dtype(options: dict) -> None:
    if options.get("dtype", "bfloat16") not in ("bfloat16", "float16"):
        raise ValueError(f"dtype must be 'bfloat16' or 'float16' (the format on the wire), got {options['dtype']!r}")


def _dtype_run_name(name: str) -> Callable[[dict], str]:
    def run_name(options: dict) -> str:
        return f"{name} {options.get('dtype', 'bfloat16')}"

    return run_name


def _register_low_precision_hooks() -> None:
    for name, attribute, summary in (
        ("ring16", "ring_hook", "the bf16/fp16 hook's arithmetic summed hop by hop on a ring, as NCCL rounds it"),
        (
            "wire16_sum32",
            "wire16_sum32_hook",
            "16-bit values on the wire, float32 sums: the ring's bytes, an error that stays flat as ranks are added",
        ),
    ):
        register(
            HookEntry(
                name,
                HOOK,
                summary,
                build=_build_wire16(attribute),
                defaults=lambda: {"dtype": "bfloat16"},
                check=_check_wire16_dtype,
                run_name=_dtype_run_name(name),
            )
        )


_register_pytorch_hooks()
_register_low_precision_hooks()
_register_compressors()

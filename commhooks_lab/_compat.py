"""Every touch of PyTorch's or Accelerate's private API, in one file.

When PyTorch or Accelerate is upgraded, this is the file to read: each function below names
the private thing it relies on, and ``tests/unit/test_compat.py`` checks each one against the
installed versions, failing with a message that names them. Checked against torch 2.13.0
and accelerate 1.15.0.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

__all__ = [
    "batched_fix_active",
    "bf16_refusal",
    "comm_hook_check_error",
    "compiled_autograd",
    "disable_dynamo_lazily",
    "fsdp2_reduce_scatter_base",
    "future_type",
    "graph_breaks",
    "intercept_comm_hook_registration",
    "is_future_graph_break",
    "optimize_ddp",
    "orthogonalize_rejects_matrices",
    "patch_batched_orthogonalize",
    "power_sgd_defaults",
    "registration_refusal",
    "reset_accelerate_state",
    "TOUCHES",
    "UpstreamChanged",
    "versions",
]


class UpstreamChanged(RuntimeError):
    """A private PyTorch/Accelerate detail the lab relies on is not what it was."""


def versions() -> str:
    """``torch X, accelerate Y`` for messages about upstream changes."""
    import torch

    try:
        import accelerate

        return f"torch {torch.__version__}, accelerate {accelerate.__version__}"
    except ImportError:
        return f"torch {torch.__version__} (accelerate not installed)"


def _upstream_changed(what: str, fix: str) -> UpstreamChanged:
    return UpstreamChanged(f"{what} (with {versions()}); {fix}")


# -- PowerSGD ------------------------------------------------------------------------------------


def power_sgd_defaults() -> dict[str, Any]:
    """``PowerSGDState``'s keyword arguments and their defaults, read from its signature.

    Public API, but its defaults (``start_powerSGD_iter=1000`` above all) are what the lab's
    notes and checks quote, so they are read here once rather than copied.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    params = inspect.signature(PowerSGDState.__init__).parameters
    defaults = {name: p.default for name, p in params.items() if name not in ("self", "process_group")}
    if "start_powerSGD_iter" not in defaults or "matrix_approximation_rank" not in defaults:
        raise _upstream_changed(
            f"PowerSGDState takes {sorted(defaults)}",
            "update commhooks_lab._compat.power_sgd_defaults and the PowerSGD checks",
        )
    return defaults


def _powersgd_module():
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    if not hasattr(powerSGD_hook, "_orthogonalize"):
        raise _upstream_changed(
            "powerSGD_hook._orthogonalize is gone", "check whether batched_powerSGD_hook still needs the lab's fix"
        )
    return powerSGD_hook


def orthogonalize_rejects_matrices() -> bool:
    """Does this PyTorch's private ``_orthogonalize`` fail on the 2-D matrix batched PowerSGD hands it?

    Decided by behaviour: any exception, or a result that is not orthonormal, counts.
    """
    import torch

    matrix = torch.tensor([[3.0], [4.0]])
    try:
        _powersgd_module()._orthogonalize(matrix)
    except Exception:
        return True
    return not torch.allclose(matrix, torch.tensor([[0.6], [0.8]]))


def patch_batched_orthogonalize() -> bool:
    """Let ``_orthogonalize`` treat a 2-D matrix as a batch of one (a view). Idempotent.

    Returns True if this call patched PyTorch; False if already patched or not needed.
    """
    powersgd = _powersgd_module()
    original = powersgd._orthogonalize
    if batched_fix_active() or not orthogonalize_rejects_matrices():
        return False

    def _orthogonalize(matrices, epsilon=0):
        if matrices.dim() == 2:
            return original(matrices.unsqueeze(0), epsilon)
        return original(matrices, epsilon)

    _orthogonalize._lab_patched = True  # type: ignore[attr-defined]
    _orthogonalize.__wrapped__ = original  # type: ignore[attr-defined]
    powersgd._orthogonalize = _orthogonalize
    return True


def batched_fix_active() -> bool:
    """Has :func:`patch_batched_orthogonalize` patched this process's PyTorch?"""
    return getattr(_powersgd_module()._orthogonalize, "_lab_patched", False)


# -- DDP -----------------------------------------------------------------------------------------


def registration_refusal(ddp_model, hook: Callable) -> str | None:
    """The TypeError DDP's own ``register_comm_hook`` would raise for this exact hook, or None.

    Uses DDP's private ``_check_comm_hook``, which is what ``register_comm_hook`` calls
    first: the lab registers hooks inside its probe, so it asks DDP about the bare hook.
    """
    check = getattr(ddp_model, "_check_comm_hook", None)
    if check is None:
        raise _upstream_changed(
            "DistributedDataParallel._check_comm_hook is gone", "update commhooks_lab._compat.registration_refusal"
        )
    try:
        check(hook)
    except TypeError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class _StandInDDP:
    """Just enough of a DistributedDataParallel for its ``_check_comm_hook`` (which only logs and raises)."""

    def _log_and_throw(self, err_type, err_msg):
        raise err_type(err_msg)


def comm_hook_check_error(hook: Callable) -> Exception | None:
    """What DDP's own ``register_comm_hook`` check raises for ``hook``, before any process starts; or None.

    Calls the private ``DistributedDataParallel._check_comm_hook`` unbound, with a stand-in
    ``self`` whose ``_log_and_throw`` raises, so no model or process group is needed.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    check = getattr(DDP, "_check_comm_hook", None)
    if check is None:
        raise _upstream_changed(
            "DistributedDataParallel._check_comm_hook is gone", "update commhooks_lab._compat.comm_hook_check_error"
        )
    try:
        check(_StandInDDP(), hook)
    except Exception as exc:
        return exc
    return None


def bf16_refusal() -> str | None:
    """DDP's own refusal of ``bf16_compress_hook`` on this build (``'TypeError: ...'``), or None where it accepts it.

    The check reads how torch was built (``torch.version.cuda``/``hip``, NCCL's version), not the devices
    (:mod:`commhooks_lab.launcher.torch_build` says it in full and tries it in a process group)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    error = comm_hook_check_error(bf16_compress_hook)
    return None if error is None else f"{type(error).__name__}: {error}"


def future_type() -> type:
    """The class every future a hook may return derives from: ``Work.get_future()`` and ``.then()`` give
    ``torch._C.Future`` (private), which the public ``torch.futures.Future`` only subclasses."""
    import torch

    base = getattr(torch._C, "Future", None)
    if not isinstance(base, type) or not issubclass(torch.futures.Future, base):
        raise _upstream_changed(
            "torch._C.Future is gone or no longer the base of torch.futures.Future",
            "update commhooks_lab._compat.future_type",
        )
    return base


def fsdp2_reduce_scatter_base() -> type:
    """FSDP2's ``ReduceScatter`` interface, the base a ``set_custom_reduce_scatter`` comm derives from.

    torch 2.13 and 2.14 define it in ``torch.distributed.fsdp._fully_shard._fsdp_api`` (private: not exported
    by ``torch.distributed.fsdp``), with ``allocate(size, *, dtype, device)`` and ``__call__(output_tensor,
    input_tensor, group, op, async_op=False)``."""
    import importlib

    try:
        base = importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_api").ReduceScatter
    except (ImportError, AttributeError):
        base = None
    expected = ["self", "output_tensor", "input_tensor", "group", "op", "async_op"]
    if not isinstance(base, type) or list(inspect.signature(base.__call__).parameters) != expected:
        raise _upstream_changed(
            "torch.distributed.fsdp._fully_shard._fsdp_api.ReduceScatter is gone or its __call__ changed",
            "update commhooks_lab._compat.fsdp2_reduce_scatter_base and commhooks_lab.engine.fsdp2_comms",
        )
    return base


@contextlib.contextmanager
def intercept_comm_hook_registration(on_register: Callable):
    """While active, ``DDP.register_comm_hook(state, hook)`` calls ``on_register(ddp, state, hook, register)``.

    Accelerate registers the hook inside ``prepare``; replacing the class attribute for that
    moment lets the lab wrap exactly what Accelerate passes.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    original = DDP.register_comm_hook

    def register_comm_hook(self, state, hook):
        return on_register(self, state, hook, lambda s, h: original(self, s, h))

    DDP.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    try:
        yield
    finally:
        DDP.register_comm_hook = original  # type: ignore[method-assign]


# -- Accelerate ----------------------------------------------------------------------------------


def reset_accelerate_state() -> None:
    """Accelerate keeps process-wide singletons; a warm rank starts each run from scratch.

    ``AcceleratorState._reset_state`` and ``GradientState._reset_state`` are private (Accelerate's
    own tests use them).
    """
    from accelerate.state import AcceleratorState, GradientState

    for cls in (AcceleratorState, GradientState):
        if not hasattr(cls, "_reset_state"):
            raise _upstream_changed(
                f"accelerate.state.{cls.__name__}._reset_state is gone",
                "update commhooks_lab._compat.reset_accelerate_state",
            )
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


# -- torch.compile -------------------------------------------------------------------------------


@contextlib.contextmanager
def optimize_ddp(value: str):
    """Set ``torch._dynamo.config.optimize_ddp`` for the block (it must be set before DDP wraps the model)."""
    import torch._dynamo.config as dynamo_config

    if not hasattr(dynamo_config, "optimize_ddp"):
        raise _upstream_changed(
            "torch._dynamo.config.optimize_ddp is gone", "update commhooks_lab._compat.optimize_ddp"
        )
    saved = dynamo_config.optimize_ddp
    dynamo_config.optimize_ddp = value  # type: ignore[assignment]
    try:
        yield
    finally:
        dynamo_config.optimize_ddp = saved


def compiled_autograd(compiler_fn: Callable):
    """Trace backward with compiled autograd (private ``torch._dynamo.compiled_autograd._enable``)."""
    from torch._dynamo import compiled_autograd as module

    if not hasattr(module, "_enable"):
        raise _upstream_changed(
            "torch._dynamo.compiled_autograd._enable is gone", "update commhooks_lab._compat.compiled_autograd"
        )
    return module._enable(compiler_fn)


def disable_dynamo_lazily(fn: Callable) -> Callable:
    """``torch.compiler.disable(fn)`` that imports Dynamo only when ``fn`` is first called (private
    ``torch._disable_dynamo``): the import takes about a second, which a process that never compiles (a
    notebook's kernel choosing a compressor) should not pay. Without it, the eager ``torch.compiler.disable``."""
    import torch

    lazy = getattr(torch, "_disable_dynamo", None)
    return torch.compiler.disable(fn) if lazy is None else lazy(fn)


def graph_breaks() -> dict[str, int]:
    """Dynamo's graph breaks in this process so far, reason -> count (private ``torch._dynamo.utils.counters``).

    Take one reading before and one after the code you compile; ``torch._dynamo.reset()`` does not clear it."""
    from torch._dynamo import utils

    counters = getattr(utils, "counters", None)
    if counters is None or not hasattr(counters, "get"):
        raise _upstream_changed("torch._dynamo.utils.counters is gone", "update commhooks_lab._compat.graph_breaks")
    return dict(counters.get("graph_break", {}))


def is_future_graph_break(reason: str) -> bool:
    """Is ``reason`` (a graph break's, from :func:`graph_breaks`) Dynamo failing to trace ``torch.futures.Future()``?

    Its wording changes between releases: torch 2.13 names ``pybind11_object.__new__``, torch 2.14 an unsupported
    call to "`__new__` of class `pybind11_type`"; both name pybind11's ``__new__``, and some reasons the Future."""
    return "Future" in reason or ("__new__" in reason and "pybind11" in reason)


#: Every touch above, for the compat test and the closing notes: (function, what it relies on).
TOUCHES = (
    ("power_sgd_defaults", "PowerSGDState.__init__ signature (public; defaults quoted in notes)"),
    ("orthogonalize_rejects_matrices", "torch...powerSGD_hook._orthogonalize (private)"),
    ("patch_batched_orthogonalize", "replaces powerSGD_hook._orthogonalize in the rank (private)"),
    ("registration_refusal", "DistributedDataParallel._check_comm_hook (private)"),
    ("comm_hook_check_error", "DistributedDataParallel._check_comm_hook called unbound (private)"),
    ("future_type", "torch._C.Future, the base of every hook future (private)"),
    ("fsdp2_reduce_scatter_base", "torch.distributed.fsdp._fully_shard._fsdp_api.ReduceScatter (private)"),
    ("intercept_comm_hook_registration", "DistributedDataParallel.register_comm_hook replaced during prepare"),
    ("reset_accelerate_state", "AcceleratorState._reset_state, GradientState._reset_state (private)"),
    ("optimize_ddp", "torch._dynamo.config.optimize_ddp (set before DDP wraps the model)"),
    ("compiled_autograd", "torch._dynamo.compiled_autograd._enable (private)"),
    ("graph_breaks", 'torch._dynamo.utils.counters["graph_break"] (private)'),
    ("disable_dynamo_lazily", "torch._disable_dynamo (private; else the eager torch.compiler.disable)"),
)

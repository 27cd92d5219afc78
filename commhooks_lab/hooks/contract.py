"""The communication hook contract, checked where it is broken.

DDP calls ``hook(state, bucket)`` and waits on what it returns: a ``torch.futures.Future``
whose value is one tensor of the bucket's size and dtype, which DDP copies back into the
gradients. Broken, PyTorch fails far from the mistake (``'Tensor' object has no attribute
'wait'``, "Expected a proper Tensor but got None" deep in ``backward``) or not at all (a
future holding half the bucket: ranks silently disagree). These checks say what the hook
returned, in one sentence naming it, before PyTorch's own error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _compat

__all__ = ["bucket_tensor", "check_returned", "check_value", "completed_future", "hook_name", "hook_result"]


def hook_name(hook: Callable) -> str:
    return getattr(hook, "__name__", None) or repr(hook)


def check_returned(hook: Callable, future: Any) -> None:
    """A hook must return a Future (DDP waits on it): say so, naming the hook, before DDP fails."""
    if not isinstance(future, _compat.future_type()):
        raise TypeError(
            f"the communication hook {hook_name(hook)} returned {_describe(future)}, not a torch.futures.Future: "
            "return a future whose value is the bucket's tensor, e.g. "
            "dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0]), or "
            "fut = torch.futures.Future(); fut.set_result(tensor); return fut."
        )


def check_value(hook: Callable, value: Any, bucket) -> Any:
    """The future's value must be one tensor of the bucket's size and dtype (DDP copies it back into the grads).

    The bucket's buffer is read when the future completes: PyTorch's fp16/bf16 wrappers swap in a
    half-precision buffer (``bucket.set_buffer``) and return it.
    """
    bucket_buffer = bucket.buffer()
    if (
        isinstance(value, torch.Tensor)
        and value.numel() == bucket_buffer.numel()
        and value.dtype == bucket_buffer.dtype
    ):
        return value
    want = f"one tensor of {bucket_buffer.numel()} {_dtype(bucket_buffer.dtype)} elements (the bucket's)"
    if value is None:
        why = "its .then() callback returned nothing; end the callback with `return tensor`"
    elif isinstance(value, (list, tuple)):
        why = "the raw future of an async collective holds a list; add .then(lambda fut: fut.value()[0])"
    elif isinstance(value, torch.Tensor) and value.numel() != bucket_buffer.numel():
        why = "DDP would copy it into the gradients anyway, and ranks would silently train on other numbers"
    elif isinstance(value, torch.Tensor):
        why = "copy it back into the bucket's buffer (bucket.buffer().copy_(tensor)) and return that"
    else:
        why = "DDP copies the value into the gradients"
    raise ValueError(
        f"the communication hook {hook_name(hook)} returned a future holding {_describe(value)}, but it must "
        f"hold {want}: {why}."
    )


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a Tensor of {value.numel()} {_dtype(value.dtype)} elements"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe(v) for v in value[:3]) + (", ..." if len(value) > 3 else "")
        return f"a {type(value).__name__} of {len(value)} ({inner})"
    return "None" if value is None else f"a {type(value).__name__}"


def completed_future(value: torch.Tensor) -> torch.futures.Future:
    """A future already holding ``value``; CUDA-aware when the value lives on a GPU."""
    devices: list[int | str | torch.device] | None = None
    if value.device.type not in ("cpu", "meta"):
        devices = [value.device]
    done: torch.futures.Future = torch.futures.Future(devices=devices)
    done.set_result(value)
    return done


def bucket_tensor(bucket) -> torch.Tensor:
    """The tensor a hook works on, in both forms DDP hands over.

    Eager DDP (and DDPOptimizer) passes a ``GradBucket``: its flat ``buffer()``. Compiled
    autograd with ``optimize_ddp="python_reducer"`` calls the hook once per parameter with the
    tuple ``(param.grad, param)`` and ignores what it returns, so the result must be written into
    that gradient before the hook returns (PyTorch's ``_compress_hook`` reads ``bucket[0]`` the same way).
    """
    return bucket[0] if isinstance(bucket, tuple) else bucket.buffer()


def hook_result(bucket, tensor: torch.Tensor):
    """What a hook returns: a completed future for a ``GradBucket``; under compiled autograd the tensor itself.

    DDP ignores the return value there, and Dynamo cannot trace creating a ``torch.futures.Future``
    (it breaks the compiled graph at pybind11's ``__new__``: :func:`commhooks_lab._compat.is_future_graph_break`).
    """
    return tensor if isinstance(bucket, tuple) else completed_future(tensor)

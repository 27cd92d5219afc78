"""PyTorch's 16-bit wrappers (``default_hooks.py``): cast the bucket around any hook."""

from __future__ import annotations

from collections.abc import Callable

from .default import BF16_NEEDS
from .registry import WRAPPER, HookEntry, register

__all__ = ["WRAPPER_SETS_BUFFER"]

WRAPPER_SETS_BUFFER = (
    "{} calls bucket.set_buffer() to cast the bucket, and under compiled autograd DDP passes the tuple "
    "(param.grad, param) instead of a GradBucket"
)


def _wrapper(attribute: str) -> Callable[[Callable], Callable]:
    def wrap(hook: Callable) -> Callable:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        return getattr(default_hooks, attribute)(hook)

    return wrap


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

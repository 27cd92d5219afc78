"""PyTorch's default hooks (``default_hooks.py``): DDP's own allreduce, the Python allreduce hook, fp16 and bf16."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .registry import HOOK, Builder, HookEntry, register
from .traffic import Shape, Traffic, allreduced, numel

__all__ = ["BF16_NEEDS", "every_element", "READS_BUCKET"]

#: Why PyTorch's bucket hooks cannot run under compiled autograd (DDP then calls hook(state, (grad, param))).
READS_BUCKET = (
    "PyTorch's {} calls bucket.buffer(), and under compiled autograd DDP passes the tuple (param.grad, param) "
    "instead of a GradBucket"
)
#: DDP checks a bf16 hook's *name* at registration (``_check_comm_hook``: ``torch.version.cuda`` or
#: ``torch.version.hip`` set and NCCL >= 2.10, or XCCL with an XPU present) and refuses it on other builds
#: (gloo reduces bf16 fine).
BF16_NEEDS = "a CUDA or ROCm build with NCCL 2.10+ (or XCCL with an XPU device present)"


def _default_hook(attribute: str) -> Builder:
    def build(options: dict, process_group: Any) -> tuple:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        return getattr(default_hooks, attribute), process_group

    return build


def every_element(bytes_per_element: int) -> Callable[[Sequence[Shape], int, dict], Traffic]:
    """One all-reduce per bucket of every gradient element, at this many bytes each."""
    return lambda shapes, buckets, options: allreduced(bytes_per_element * sum(map(numel, shapes)), buckets)


register(
    HookEntry(
        "no",
        HOOK,
        "DDP's built-in C++ allreduce (no hook registered)",
        build=lambda options, process_group: (None, None),
        accelerate="no",
        traffic=every_element(4),
        overlaps_backward=True,
    )
)
register(
    HookEntry(
        "allreduce",
        HOOK,
        "PyTorch's Python allreduce_hook: the exact average, as a hook",
        build=_default_hook("allreduce_hook"),
        not_compilable=READS_BUCKET.format("allreduce_hook"),
        traffic=every_element(4),
        overlaps_backward=True,
        fsdp2_reduce_dtype="float32",
    )
)
register(
    HookEntry(
        "fp16",
        HOOK,
        "cast to float16, divide by world size, allreduce, cast back",
        build=_default_hook("fp16_compress_hook"),
        accelerate="fp16",
        traffic=every_element(2),
        overlaps_backward=True,
        fsdp2_reduce_dtype="float16",
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
        traffic=every_element(2),
        overlaps_backward=True,
        fsdp2_reduce_dtype="bfloat16",
    )
)

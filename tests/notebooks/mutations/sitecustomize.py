"""Break the arithmetic on purpose, in every process of a run: the notebook checks must notice.

Put this folder on PYTHONPATH and name a mutation in COMMHOOKS_LAB_MUTATION; Python imports this file at
start-up in the kernel, the rank server and every spawned rank alike, and patches the named module as soon as
it is imported. ``tests/test_mutations.py`` runs a notebook under each mutation.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys


def _fp16_divides_after_the_sum(default_hooks) -> None:
    """fp16_compress_hook, but dividing by the world size after the 16-bit sum instead of before."""
    import torch
    import torch.distributed as dist

    def _compress_hook(dtype, process_group, bucket):
        group = process_group if process_group is not None else dist.group.WORLD
        buffer = bucket[0] if isinstance(bucket, tuple) else bucket.buffer()
        compressed = buffer.to(dtype)
        fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

        def decompress(fut):
            buffer.copy_(fut.value()[0].div_(group.size()))
            return buffer

        return fut.then(decompress)

    assert hasattr(default_hooks, "_compress_hook") and torch is not None
    default_hooks._compress_hook = _compress_hook


def _powersgd_matrix_rank_two(powersgd) -> None:
    """PowerSGDState asked for matrix rank 1 runs matrix rank 2."""
    import functools

    original = powersgd.PowerSGDState.__init__

    @functools.wraps(original)  # the lab reads PowerSGDState's signature for its defaults
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.matrix_approximation_rank == 1:
            self.matrix_approximation_rank = 2

    powersgd.PowerSGDState.__init__ = __init__


def _one_more_byte(default_hooks) -> None:
    """fp16_compress_hook sends one byte more per bucket (a uint8 all-reduced beside its payload)."""
    import functools

    import torch
    import torch.distributed as dist

    original = default_hooks.fp16_compress_hook

    @functools.wraps(original)
    def fp16_compress_hook(process_group, bucket):
        dist.all_reduce(torch.zeros(1, dtype=torch.uint8), group=process_group)
        return original(process_group, bucket)

    default_hooks.fp16_compress_hook = fp16_compress_hook


HOOKS = "torch.distributed.algorithms.ddp_comm_hooks"
MUTATIONS = {
    "fp16_divides_after_the_sum": (f"{HOOKS}.default_hooks", _fp16_divides_after_the_sum),
    "powersgd_matrix_rank_two": (f"{HOOKS}.powerSGD_hook", _powersgd_matrix_rank_two),
    "one_more_byte": (f"{HOOKS}.default_hooks", _one_more_byte),
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Find ``module`` as usual, and patch it right after it has executed."""

    def __init__(self, module: str, patch) -> None:
        self.module, self.patch = module, patch

    def find_spec(self, name, path=None, target=None):
        if name != self.module:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader, patch = spec.loader, self.patch
        execute = loader.exec_module

        def exec_and_patch(module) -> None:
            execute(module)
            patch(module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


_chosen = os.environ.get("COMMHOOKS_LAB_MUTATION")
if _chosen:
    _module, _patch = MUTATIONS[_chosen]
    if _module in sys.modules:
        _patch(sys.modules[_module])
    else:
        sys.meta_path.insert(0, _PatchAfterImport(_module, _patch))

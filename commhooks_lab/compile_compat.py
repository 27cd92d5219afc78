"""Which hooks survive ``torch.compile``: a compatibility matrix computed on this machine, never typed.

Three ways to run a DDP step with a comm hook:

- ``eager``: no compile;
- ``ddp_optimizer``: ``torch.compile(ddp_model)`` with Dynamo's default DDPOptimizer, which splits
  the graph at bucket boundaries so DDP's reducer (and the hook) runs as in eager;
- ``compiled_autograd``: ``optimize_ddp="python_reducer"`` plus compiled autograd, where the
  backward is traced and the hook is called with another argument than a ``GradBucket``.

Each hook runs one step in each mode on two real ranks from the same weights and batch; the
table says whether it ran, the real error text if not, and how the gradient it produced compares
with eager's (bit-identical, or the relative difference). Compile backend: ``aot_eager`` by
default (no C++ build: seconds on a laptop); pass ``backend="inductor"`` to use the real one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MODES = ("eager", "ddp_optimizer", "compiled_autograd")
_CACHE: dict[tuple, Any] = {}


def _one_case(hook_name: str, mode: str, backend: str, seed: int = 0):
    """One step of a tiny MLP under ``mode`` with the registered hook; returns the flat gradient."""
    import torch
    import torch._dynamo
    from torch.nn.parallel import DistributedDataParallel as DDP

    from . import _compat, registry

    entry = registry.get(hook_name)
    options = {"start_powerSGD_iter": 2} if entry.power_sgd else {}
    torch._dynamo.reset()
    with _compat.optimize_ddp("python_reducer" if mode == "compiled_autograd" else "ddp_optimizer"):
        torch.manual_seed(seed)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)))
        if entry.prepare is not None:
            entry.prepare()
        assert entry.build is not None
        hook, state = entry.build(entry.options_with_defaults(options), None)
        if hook is not None:
            model.register_comm_hook(state, hook)
        generator = torch.Generator().manual_seed(seed + torch.distributed.get_rank())
        x, y = torch.randn(16, 64, generator=generator), torch.randint(0, 10, (16,), generator=generator)
        run = model if mode == "eager" else torch.compile(model, backend=backend)
        loss = torch.nn.functional.cross_entropy(run(x), y)
        if mode == "compiled_autograd":
            with _compat.compiled_autograd(torch.compile(backend=backend)):
                loss.backward()
        else:
            loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def matrix_job(ctx, hooks: Sequence[str], modes: Sequence[str], backend: str) -> list[dict]:
    """Worker: every hook in every mode; rank 0's rows (every rank runs the same cases in the same order)."""
    import time

    from .availability import root_error

    rows = []
    for hook in hooks:
        eager = None
        for mode in modes:
            start = time.perf_counter()
            try:
                grad = _one_case(hook, mode, backend)
                error = ""
            except Exception as exc:
                grad, error = None, root_error(exc)
            seconds = time.perf_counter() - start
            if mode == "eager":
                eager = grad
            row = {"hook": hook, "mode": mode, "runs": grad is not None, "error": error, "seconds": round(seconds, 2)}
            if grad is not None and eager is not None:
                row["bit_identical_to_eager"] = bool(grad.equal(eager))
                row["rel_diff_vs_eager"] = float((grad - eager).norm() / eager.norm()) if eager.norm() > 0 else 0.0
            rows.append(row)
    return rows


def compile_compatibility(
    hooks: Sequence[str] | None = None, modes: Sequence[str] = MODES, backend: str = "aot_eager", cluster=None
):
    """The matrix as a table (one row per hook and mode), computed once per process for the same arguments."""
    import pandas as pd

    from . import registry
    from .launcher import launch

    hooks = tuple(hooks or [e.name for e in registry.entries(registry.HOOK) if e.name != "no"])
    key = (hooks, tuple(modes), backend)
    if key not in _CACHE:
        if cluster is not None:
            rows = cluster.run(matrix_job, hooks, tuple(modes), backend, timeout_s=300)[0]
        else:
            rows = launch(matrix_job, hooks, tuple(modes), backend, world_size=2, timeout_s=300)[0]
        _CACHE[key] = pd.DataFrame(rows)
    return _CACHE[key].copy()

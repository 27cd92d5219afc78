"""Which hooks survive ``torch.compile``: a compatibility matrix computed on this machine, never typed.

Three ways to run a DDP step with a comm hook:

- ``eager``: no compile;
- ``ddp_optimizer``: ``torch.compile(ddp_model)`` with Dynamo's default DDPOptimizer, which splits
  the graph at bucket boundaries so DDP's reducer (and the hook) runs as in eager;
- ``compiled_autograd``: ``optimize_ddp="python_reducer"`` plus compiled autograd, where the
  backward is traced and the hook is called with another argument than a ``GradBucket``.

Each hook runs ``STEPS`` steps in each mode on two real ranks from the same weights and batch; the
table says whether it ran, the real error text if not, how the gradient it produced compares
with eager's (bit-identical, or the relative difference), and how many graph breaks Dynamo counted
while compiling it (``graph_breaks``; ``graph_break``: their reasons, most frequent first). Compile
backend: ``aot_eager`` by default (no C++ build: seconds on a laptop); pass ``backend="inductor"`` to
use the real one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..engine.ddp_job import quiet_dynamo
from ..hooks import registry
from ..hooks.choice import HookChoice, as_choice, build_hook

__all__ = ["compile_compatibility", "default_lineup", "MODES", "STEPS", "torch_source"]

MODES = ("eager", "ddp_optimizer", "compiled_autograd")
#: Steps per case: PowerSGD (start_powerSGD_iter=2) compresses in the last, error feedback has memory.
STEPS = 3
_CACHE: dict[tuple, Any] = {}


def default_lineup() -> list[Any]:
    """Every registered hook and compressor family (default options) and each wrapper around allreduce.

    Not a record that communicates from the optimizer's step post-hook (local SGD, DiLoCo): the matrix runs no
    optimizer, so it would try the DDP hook they register and never their synchronisation."""
    items: list[Any] = [e.name for e in registry.entries(registry.HOOK) if e.step_post_hook is None]
    items += [e.name for e in registry.entries(registry.COMPRESSOR)]
    items += [{"hook": "allreduce", "wrapper": e.name} for e in registry.entries(registry.WRAPPER) if e.name != "no"]
    return items


def _one_case(
    choice: HookChoice, mode: str, backend: str, seed: int = 0, breaks: dict | None = None, fresh: bool = True
):
    """``STEPS`` steps of a tiny MLP under ``mode`` with the hook; returns the last step's flat gradient.

    ``breaks``, if given, receives the graph breaks Dynamo counted during a case that completes (reason -> count).
    ``fresh=False`` keeps Dynamo's caches from the case before, which must have run in the same mode (see
    :func:`_matrix_job`)."""
    import torch
    import torch._dynamo
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .. import _compat

    if choice.entry is not None:
        choice = replace(choice, state_options=tuple(sorted(choice.entry.short_run_options(choice.options).items())))
    if fresh:
        torch._dynamo.reset()
    before = _compat.graph_breaks()
    switch = _compat.optimize_ddp("python_reducer" if mode == "compiled_autograd" else "ddp_optimizer")
    with switch, quiet_dynamo():
        torch.manual_seed(seed)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)))
        hook, state = build_hook(choice)
        if hook is not None:
            model.register_comm_hook(state, _registrable(model, hook))
        generator = torch.Generator().manual_seed(seed + torch.distributed.get_rank())
        x, y = torch.randn(16, 64, generator=generator), torch.randint(0, 10, (16,), generator=generator)
        run = model if mode == "eager" else torch.compile(model, backend=backend)
        for _ in range(STEPS):  # no optimizer: the same gradient each step, changed only by the hook's state
            model.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(run(x), y)
            if mode == "compiled_autograd":
                with _compat.compiled_autograd(torch.compile(backend=backend)):
                    loss.backward()
            else:
                loss.backward()
    if breaks is not None:
        after = _compat.graph_breaks()
        breaks.update({why: n - before.get(why, 0) for why, n in after.items() if n > before.get(why, 0)})
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def _short_reason(reason: str) -> str:
    """Dynamo's reason in one line: its title and, if there is one, its explanation."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    explanation = next(
        (line.removeprefix("Explanation:").strip() for line in lines if line.startswith("Explanation:")), ""
    )
    first_sentence = re.search(r"\.`?(?=\s+[A-Z])", explanation)
    explanation = explanation[: first_sentence.end()] if first_sentence else explanation
    return f"{lines[0]}: {explanation}" if lines and explanation else (lines[0] if lines else "")


def _registrable(model, hook):
    """``hook`` itself, or a plain wrapper when DDP refuses it by name on this build (bf16 without NCCL).

    gloo runs the arithmetic fine; the lab's runs register such hooks inside the probe the same way.
    """
    from .. import _compat

    if _compat.registration_refusal(model, hook) is None:
        return hook

    def registered(state, bucket):
        return hook(state, bucket)

    registered.__annotations__ = hook.__annotations__
    return registered


def _matrix_job(
    ctx, choices: Sequence[HookChoice], modes: Sequence[str], backend: str, count_breaks: bool = True
) -> list[dict]:
    """Worker: every hook in every mode; rank 0's rows, hook by hook (every rank runs the same cases in the same order).

    Mode by mode, each mode from ``torch._dynamo.reset()`` (hook by hook without resets, fp16 got a wrong
    gradient under compiled autograd: ``optimize_ddp`` is read when DDP wraps the model). With ``count_breaks``
    every case starts from a reset, as a fresh process would; without, the cases after a mode's first keep Dynamo's
    caches (its guards recompile what another hook changes: on every registered hook, compressor and wrapper the
    runs, errors and gradients were the same as from a reset, at 10 instead of 25 CPU-seconds a rank), and their
    graph breaks are not counted (None): breaks in code that hooks share (the compressors', ``completed_future``)
    are compiled, so counted, once.
    """
    import hashlib
    import time

    from .availability import root_error

    rows: dict[tuple[int, str], dict] = {}
    eager: dict[int, Any] = {}
    for mode in modes:
        for i, choice in enumerate(choices):
            start = time.perf_counter()
            breaks: dict[str, int] = {}
            counted = mode == "eager" or count_breaks or i == 0
            try:
                grad = _one_case(choice, mode, backend, breaks=breaks, fresh=count_breaks or i == 0)
                error = ""
            except Exception as exc:
                grad, error = None, root_error(exc)
            seconds = time.perf_counter() - start
            if mode == "eager":
                eager[i] = grad
            row = {
                "hook": choice.name,
                "mode": mode,
                "runs": grad is not None,
                "error": error,
                "seconds": round(seconds, 2),
                "graph_breaks": sum(breaks.values()) if counted else None,
                "graph_break": " | ".join(_short_reason(why) for why in sorted(breaks, key=breaks.__getitem__)[::-1])
                if counted
                else None,
            }
            if grad is not None:
                row["grad_sha256"] = hashlib.sha256(grad.detach().numpy().tobytes()).hexdigest()[:16]
            base = eager.get(i)
            if grad is not None and base is not None:
                row["bit_identical_to_eager"] = bool(grad.equal(base))
                row["rel_diff_vs_eager"] = float((grad - base).norm() / base.norm()) if base.norm() > 0 else 0.0
            rows[i, mode] = row
    return [rows[i, mode] for i in range(len(choices)) for mode in modes]


def compile_compatibility(
    hooks: Sequence[Any] | None = None,
    modes: Sequence[str] = MODES,
    backend: str = "aot_eager",
    cluster=None,
    count_breaks: bool = True,
):
    """The matrix as a table (one row per hook and mode, hook by hook), each hook computed once per process for the
    same modes, backend and world size: a later table runs only the hooks it has not seen (notebook 11's exercise
    checks each attempt beside the same reference).

    ``hooks``: names (``"topk[ratio=0.05]"``), dicts such as ``{"hook": "allreduce", "wrapper": "fp16"}``,
    or your own hook functions; by default :func:`default_lineup`. Every item is checked before
    any process starts. ``count_breaks=False``: the hooks share Dynamo's caches within a mode, at about 40 % of the
    CPU, and only the first hook's graph breaks are counted (the others' are None).
    """
    import pandas as pd

    from ..launcher import launch

    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown modes {unknown}; choose from {list(MODES)}")
    choices = [as_choice(item) for item in (default_lineup() if hooks is None else hooks)]
    world_size = 2 if cluster is None else cluster.world_size
    keys = [
        (repr(c), tuple(modes), backend, world_size, count_breaks) for c in choices
    ]  # a redefined hook is a new function
    missing = dict((key, c) for key, c in zip(keys, choices) if key not in _CACHE)
    if missing:
        args = (tuple(missing.values()), tuple(modes), backend, count_breaks)
        if cluster is not None:
            rows = cluster.run(_matrix_job, *args, timeout_s=300)[0]
        else:
            rows = launch(_matrix_job, *args, world_size=world_size, timeout_s=300)[0]
        for n, (key, choice) in enumerate(missing.items()):  # the choice too: its function's id stays taken
            _CACHE[key] = (choice, rows[n * len(modes) : (n + 1) * len(modes)])
    return pd.DataFrame([row for key in keys for row in _CACHE[key][1]])


def torch_source(obj: Any, contains: str | Sequence[str], context: int = 0) -> str:
    """The lines of PyTorch's installed source of ``obj`` that contain ``contains`` (and ``context`` around),
    under the file's name, with line numbers: read what your torch does, not what a tutorial remembers."""
    import inspect

    lines, first = inspect.getsourcelines(obj)
    path = inspect.getsourcefile(obj) or "?"
    short = path[path.rfind("torch/") :] if "torch/" in path else path
    wanted = [contains] if isinstance(contains, str) else list(contains)
    missing = [w for w in wanted if not any(w in line for line in lines)]
    if missing:
        raise ValueError(f"{missing} not in {short} {obj.__qualname__} any more: PyTorch changed it")
    hits = [i for i, line in enumerate(lines) if any(w in line for w in wanted)]
    keep = sorted({j for i in hits for j in range(max(0, i - context), min(len(lines), i + context + 1))})
    out = [f"# {short}, {obj.__qualname__}"]
    for before, j in zip([None, *keep], keep):
        if before is not None and j > before + 1:
            out.append("      ...")  # lines left out
        out.append(f"{first + j:5d}  {lines[j].rstrip()}")
    return "\n".join(out)

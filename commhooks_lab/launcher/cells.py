"""What a rank does with a notebook cell: run it in a namespace of its own that lives as long as the rank.

The ``%%ddp`` magic (:mod:`commhooks_lab.magics`) sends these functions to the kernel's warm ranks. A rank keeps
its namespace in this module between cells, so a model built in one cell is there in the next; the process group
is already initialised (``dist``), and ``ctx``, ``rank`` and ``world_size`` are set. What a cell prints is
captured and returned, with its last expression's repr (as IPython shows it) or its traceback.
"""

from __future__ import annotations

import ast
import contextlib
import io
import traceback
from typing import Any

__all__ = ["namespace", "pull", "push", "reset", "run_cell"]

#: One namespace per name, in each rank process, kept between cells (gone when the rank stops).
_NAMESPACES: dict[str, dict] = {}


def namespace(ctx, key: str = "ddp") -> dict:
    """This rank's namespace for ``key`` (made on first use), with ``ctx``, ``rank`` and ``world_size`` current."""
    if key not in _NAMESPACES:
        import torch
        import torch.distributed as dist

        _NAMESPACES[key] = {"__name__": "__ddp__", "torch": torch, "dist": dist}
    ns = _NAMESPACES[key]
    ns.update(ctx=ctx, rank=ctx.rank, world_size=ctx.world_size)
    return ns


def run_cell(ctx, code: str, ranks: list[int] | None = None, key: str = "ddp") -> dict:
    """Run ``code`` here (if this rank is among ``ranks``); return what it printed, its value, or its traceback."""
    if ranks is not None and ctx.rank not in ranks:
        return {"rank": ctx.rank, "skipped": True}
    ns = namespace(ctx, key)
    tree = ast.parse(code, mode="exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    assert last is None or isinstance(last, ast.Expr)
    printed, value, error = io.StringIO(), None, None
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            exec(compile(tree, f"<%%ddp cell, rank {ctx.rank}>", "exec"), ns)
            if last is not None:
                result = eval(compile(ast.Expression(last.value), f"<%%ddp cell, rank {ctx.rank}>", "eval"), ns)
                value = None if result is None else repr(result)
        except Exception:
            error = traceback.format_exc()
    return {"rank": ctx.rank, "skipped": False, "out": printed.getvalue(), "value": value, "error": error}


def push(ctx, values: dict[str, Any], key: str = "ddp") -> None:
    """Put the kernel's ``values`` into this rank's namespace."""
    namespace(ctx, key).update(values)


def pull(ctx, names: list[str], ranks: list[int] | None = None, key: str = "ddp") -> dict[str, Any]:
    """This rank's values of ``names`` (a missing one raises, naming it); nothing if it is not among ``ranks``."""
    if ranks is not None and ctx.rank not in ranks:
        return {}
    ns = namespace(ctx, key)
    missing = [n for n in names if n not in ns]
    if missing:
        raise NameError(f"not defined on rank {ctx.rank}: {', '.join(missing)}")
    return {n: ns[n] for n in names}


def reset(ctx, key: str = "ddp") -> None:
    """Forget this rank's namespace (variables, models) without stopping the rank."""
    _NAMESPACES.pop(key, None)

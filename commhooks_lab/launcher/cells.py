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

__all__ = ["MISSING", "namespace", "pull", "push", "reset", "run_cell"]

#: The key of :func:`pull`'s answer that lists the names a rank does not have.
MISSING = "__missing__"
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


class _Captured(io.StringIO):
    """What a cell prints; a cell that closes ``sys.stdout`` closes nothing (its text is still returned)."""

    def close(self) -> None:
        pass


def _no_fork(*args: Any, **kwargs: Any) -> int:
    raise RuntimeError(
        "os.fork() in a %%ddp cell: the copy would share this rank's process group and its pipe to the kernel, "
        "answer in the rank's place and hang in its shutdown; start processes with subprocess, or with "
        "multiprocessing.get_context('spawn')"
    )


def _changed_state(dtype: Any) -> tuple[str | None, bool]:
    """What a cell changed that the rank's other work (``lab.run`` on these warm ranks) depends on, undone where
    it can be: a message for the cell's output (or None), and whether the rank must restart."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return (
            "the cell destroyed the ranks' process group (dist.destroy_process_group()): every run on these ranks "
            "needs it, so the kernel restarts them, and this cell's namespaces go with them",
            True,
        )
    if torch.get_default_dtype() != dtype:
        changed = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        return (
            f"the cell set torch's default dtype to {changed}; the rank's other runs need {dtype}, so it is {dtype} "
            f"again after every cell: pass dtype={changed} where you make a tensor instead",
            False,
        )
    return None, False


def run_cell(ctx, code: str, ranks: list[int] | None = None, key: str = "ddp") -> dict:
    """Run ``code`` here (if this rank is among ``ranks``); return what it printed, its value, or its traceback.

    Nothing a cell does ends the rank: errors of every kind (a ``SyntaxError``, ``sys.exit()``) come back as its
    traceback, ``os.fork()`` is refused, and a destroyed process group is reported (``restart``) for the kernel.
    """
    import os

    import torch

    if ranks is not None and ctx.rank not in ranks:
        return {"rank": ctx.rank, "skipped": True}
    ns = namespace(ctx, key)
    name = f"<%%ddp cell, rank {ctx.rank}>"
    printed, value, error, dtype, fork, pid = _Captured(), None, None, torch.get_default_dtype(), os.fork, os.getpid()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            os.fork = _no_fork
            tree = ast.parse(code, filename=name, mode="exec")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, name, "exec"), ns)
            if isinstance(last, ast.Expr):
                result = eval(compile(ast.Expression(last.value), name, "eval"), ns)
                value = None if result is None else repr(result)
        except (Exception, SystemExit):
            error = traceback.format_exc()
        finally:
            os.fork = fork
            if os.getpid() != pid:  # forked by another way (os.forkpty, ctypes): the copy must not answer the kernel
                os._exit(0)
    changed, restart = _changed_state(dtype)
    if restart:
        error = (error or "") + f"{changed}\n"
    elif changed is not None:
        print(f"note: {changed}", file=printed)
    return {
        "rank": ctx.rank,
        "skipped": False,
        "out": printed.getvalue(),
        "value": value,
        "error": error,
        "restart": restart,
    }


def push(ctx, values: dict[str, Any], key: str = "ddp") -> None:
    """Put the kernel's ``values`` into this rank's namespace."""
    namespace(ctx, key).update(values)


def pull(ctx, names: list[str], ranks: list[int] | None = None, key: str = "ddp") -> dict[str, Any]:
    """This rank's values of ``names`` (a missing one raises, naming it); nothing if it is not among ``ranks``."""
    if ranks is not None and ctx.rank not in ranks:
        return {}
    ns = namespace(ctx, key)
    missing = [n for n in names if n not in ns]
    if missing:  # the kernel raises it: an error here would stop the ranks and lose every namespace
        return {MISSING: missing}
    return {n: ns[n] for n in names}


def reset(ctx, key: str = "ddp") -> None:
    """Forget this rank's namespace (variables, models) without stopping the rank."""
    _NAMESPACES.pop(key, None)

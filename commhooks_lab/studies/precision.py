"""Precision at scale: how the error of a 16-bit gradient reduction grows with the number of ranks.

Running 16 real ranks on a laptop measures the scheduler, so this study replays the arithmetic in
one process, exactly: it computes every rank's local gradient of a lab task (the same model, seed
and batches the ranks would use), then reduces them the way each method rounds:

- ``ring``: cast to 16 bits, divide by W, add chunk by chunk around a ring with a 16-bit rounding
  after every hop — as NCCL's ring algorithm does (gloo picks other algorithms, so
  ``bf16_compress_hook`` on gloo rounds in another order; :func:`~commhooks_lab.hooks.low_precision.ring_hook`
  runs this very order on real ranks, and a test checks the two agree);
- ``wire16_sum32``: the same 16-bit values, summed in float32, the sum rounded to 16 bits once;
- ``one_rounding``: the exact mean rounded to 16 bits once — no reduction can beat this floor;
- ``bound``: the worst case for the ring, derived below, evaluated on these gradients.

The bound: PyTorch's hook computes y_r = fl(fl(g_r) / W) (two roundings, |y_r - g_r/W| <= gamma_2 |g_r|/W)
and the ring adds W values with W-1 roundings (Higham, Accuracy and Stability of Numerical Algorithms,
2nd ed., eq. 4.4: |error| <= gamma_{W-1} sum_r |y_r|), so per element
|h - mean| <= gamma_{W+1} * sum_r |g_r| / W, with gamma_n = n u / (1 - n u), as long as nothing
overflows and no cast or quotient of a nonzero value falls below the smallest normal number
(subnormal, or flushed to zero); an addition with a subnormal result is exact. The norm of that
vector over the norm of the mean is the ``bound`` row. It grows with W and with cancellation;
measured errors sit far below it.
:func:`ring_bound_check` checks the bound element by element, and where a value underflows (float16
does, on these gradients) it adds the model's absolute underflow term.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

__all__ = [
    "bound_checks",
    "local_gradients",
    "plot_precision",
    "precision_vs_world_size",
    "reduce_16bit",
    "rel_error",
    "ring_bound_check",
]

UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """The ranks run with one thread; so must the replay, for bit-identical gradients."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def local_gradients(model: str = "mlp", world_size: int = 8, batch_size: int = 32, seed: int = 0) -> torch.Tensor:
    """Each rank's local gradient at the first step, as rows of a (W, n) float32 tensor.

    The same task, initial weights and DistributedSampler batches as ``lab.run(model=..., world_size=W)``.
    """
    from ..engine.data import rank_batches
    from ..engine.models import build_task

    rows = []
    with one_thread():
        for rank in range(world_size):
            task = build_task(model, seed)
            x, y = next(rank_batches(task.train, rank, world_size, batch_size, seed))
            task.model.zero_grad(set_to_none=True)
            task.loss_fn()(task.model(x), y).backward()
            rows.append(torch.cat([p.grad.reshape(-1) for p in task.model.parameters() if p.grad is not None]))
    return torch.stack(rows)


def _not_normal(rounded: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """Where rounding ``before`` to ``rounded`` can err by more than u relatively: the result is subnormal
    (nonzero, below the smallest normal), flushed to zero from a nonzero value, or infinite."""
    flushed = (rounded == 0) & (before != 0)
    return ((rounded != 0) & (rounded.abs() < torch.finfo(rounded.dtype).tiny)) | flushed | rounded.isinf()


def _ring(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ring's sum of the rows of ``values``, and per element whether a partial sum overflowed.

    A partial sum that is subnormal needs no flag: an addition of two 16-bit numbers with a subnormal
    result is exact (both are multiples of the smallest subnormal, and so is their sum).
    """
    world = values.shape[0]
    pieces = [list(row.tensor_split(world)) for row in values]
    out, outside = [], []
    for chunk in range(world):
        acc = pieces[chunk][chunk].clone()
        flag = torch.zeros(acc.shape, dtype=torch.bool)
        for step in range(1, world):
            acc += pieces[(chunk + step) % world][chunk]  # one rounding in the 16-bit dtype per hop
            flag |= acc.isinf()
        out.append(acc)
        outside.append(flag)
    return torch.cat(out), torch.cat(outside)


def ring_allreduce(values: torch.Tensor) -> torch.Tensor:
    """Sum the rows of ``values`` (W, n) as a ring does, rounding to ``values.dtype`` after every hop.

    In hop s rank r sends piece (r - s) mod W to rank r + 1, which adds its own copy: piece c
    starts at rank c and picks up ranks c+1, c+2, ..., c-1 (mod W) in that order.
    """
    return _ring(values)[0]


def reduce_16bit(grads: torch.Tensor, dtype: torch.dtype, method: str) -> torch.Tensor:
    """The mean gradient as ``method`` leaves it, in float64 for measuring.

    ``wire16_sum32_unrounded`` is ``wire16_sum32`` without its last rounding: the float32 sum of the
    W rounded inputs, to split the fix's error into its inputs' roundings and the last one.
    """
    world = grads.shape[0]
    if method == "ring":
        return ring_allreduce(grads.to(dtype).div_(world)).double()
    if method == "wire16_sum32":
        return (grads / world).to(dtype).float().sum(dim=0).to(dtype).double()
    if method == "wire16_sum32_unrounded":  # the same float32 sum, before its last rounding to 16 bits
        return (grads / world).to(dtype).float().sum(dim=0).double()
    if method == "one_rounding":
        return grads.double().mean(dim=0).to(dtype).double()
    raise ValueError(
        f"unknown method {method!r}; choose 'ring', 'wire16_sum32', 'wire16_sum32_unrounded' or 'one_rounding'"
    )


def rel_error(h: torch.Tensor, exact: torch.Tensor) -> float:
    return float((h - exact).norm() / exact.norm())


def _worst_case_bound(grads: torch.Tensor, dtype: torch.dtype) -> float:
    """|| gamma_{W+1} sum_r |g_r| / W || / || mean_r g_r ||: the ring's worst case (see the module doc)."""
    world = grads.shape[0]
    n_u = (world + 1) * UNIT_ROUNDOFF[dtype]
    gamma = n_u / (1 - n_u)
    g = grads.double()
    return float(gamma * g.abs().mean(dim=0).norm() / g.mean(dim=0).norm())


def ring_bound_check(grads: torch.Tensor, dtype: torch.dtype) -> dict[str, int]:
    """The ring's error against its per-element bound, element by element, with the bound's condition.

    The condition: no cast of an element to 16 bits and no quotient by W is subnormal, flushed to zero
    from a nonzero value, or infinite,
    and no partial sum of the ring overflows. A partial sum may be subnormal: an addition with a
    subnormal result is exact. Where a cast or quotient underflows, the model of rounding with
    underflow (Higham, 2nd ed., section 2.1) adds an absolute error of at most lambda*u per cast or
    division (lambda the smallest normal number), so
    |h - mean| <= gamma_{W+1} sum_r |g_r| / W + (1 + gamma_W) (W + 1) lambda u holds for every element.
    Returns element counts: ``subnormal`` (the condition fails there: a cast or quotient was subnormal
    or a value infinite, and ``overflow`` counts the infinite ones), ``over_bound`` (elements over the
    plain bound, of which ``over_bound_where_it_holds`` satisfy the condition) and
    ``over_bound_with_underflow``.
    """
    world = grads.shape[0]
    u, tiny = UNIT_ROUNDOFF[dtype], torch.finfo(dtype).tiny

    def gamma(k: int) -> float:
        return k * u / (1 - k * u)

    cast = grads.to(dtype)
    quotient = cast / world
    h, partial_outside = _ring(quotient)
    outside = _not_normal(cast, grads).any(dim=0) | _not_normal(quotient, cast).any(dim=0) | partial_outside
    g = grads.double()
    error = (h.double() - g.mean(dim=0)).abs()
    bound = gamma(world + 1) * g.abs().mean(dim=0)
    with_underflow = bound + (1 + gamma(world)) * (world + 1) * tiny * u
    over = error > bound
    return {
        "elements": int(g.shape[1]),
        "subnormal": int(outside.sum()),
        "overflow": int((cast.isinf().any(dim=0) | quotient.isinf().any(dim=0) | h.isinf()).sum()),
        "over_bound": int(over.sum()),
        "over_bound_where_it_holds": int((over & ~outside).sum()),
        "over_bound_with_underflow": int((error > with_underflow).sum()),
    }


def _table(row_of, world_sizes: Sequence[int], model: str, dtypes: Sequence[torch.dtype], seed: int):
    """One row per W and dtype: ``row_of(grads, dtype)`` of that W's local gradients, beside W and the dtype."""
    import pandas as pd

    rows = []
    for world in world_sizes:
        grads = local_gradients(model, world, seed=seed)
        for dtype in dtypes:
            rows.append({"world_size": world, "dtype": str(dtype).replace("torch.", ""), **row_of(grads, dtype)})
    return pd.DataFrame(rows)


def bound_checks(
    world_sizes: Sequence[int] = (2, 4, 8, 16),
    model: str = "mlp",
    dtypes: Sequence[torch.dtype] = (torch.bfloat16, torch.float16),
    seed: int = 0,
):
    """:func:`ring_bound_check` per W and dtype, as a table (the gradients of :func:`precision_vs_world_size`)."""
    return _table(ring_bound_check, world_sizes, model, dtypes, seed)


def _errors(grads: torch.Tensor, dtype: torch.dtype) -> dict[str, float]:
    """rel_error of each method against the float64 mean, and the worst-case bound."""
    exact = grads.double().mean(dim=0)
    row = {
        method: rel_error(reduce_16bit(grads, dtype, method), exact)
        for method in ("ring", "wire16_sum32", "one_rounding")
    }
    return {**row, "bound": _worst_case_bound(grads, dtype)}


def precision_vs_world_size(
    world_sizes: Sequence[int] = (2, 4, 8, 16),
    model: str = "mlp",
    dtypes: Sequence[torch.dtype] = (torch.bfloat16, torch.float16),
    seed: int = 0,
):
    """A table: rel_error of each method, the one-rounding floor and the worst-case bound, per W and dtype."""
    return _table(_errors, world_sizes, model, dtypes, seed)


def plot_precision(table, dtype: str = "bfloat16"):
    """Error against world size for one dtype: the ring grows, float32 sums stay near the floor."""
    import matplotlib.pyplot as plt

    from .._util import fit_titles

    rows = table[table["dtype"] == dtype].set_index("world_size")
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    styles = {
        "ring": ("ring all-reduce in " + dtype + " (a ring's rounding order)", "o-"),
        "wire16_sum32": (dtype + " on the wire, float32 sums", "s-"),
        "one_rounding": ("floor: the exact mean rounded once", "k--"),
        "bound": ("worst case for the ring, gamma_(W+1) x cancellation", "k:"),
    }
    for column, (label, style) in styles.items():
        ax.plot(rows.index, rows[column], style, label=label)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="world size W (ranks)",
        ylabel="rel_error of the mean gradient",
        title=f"{dtype}: the ring's error grows with W; summing in float32 keeps it near one rounding",
    )
    from matplotlib.ticker import NullFormatter

    ax.set_xticks(list(rows.index), [str(w) for w in rows.index])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.legend(fontsize=8, loc="upper left")
    return fit_titles(fig)

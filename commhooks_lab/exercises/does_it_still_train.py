"""Notebook 9's exercise: one step of error feedback on W ranks, simulated in one process. The check runs it for
four steps at 2, 3 and 4 ranks with two compressors (top-1 and a scaled sign) and tells apart the usual slips:
no memory (or a residual rebound, not kept), the residual taken against the average every rank receives (PyTorch
PowerSGD's bookkeeping, not a per-rank compressor's), the residual of the raw gradient, a flipped sign, a residual
that piles up, one residual shared by all ranks, a sum for a mean, and a 2 where the world size belongs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .checking import NOTHING_LATER, Outcome, check_function, reference

__all__ = ["check_error_feedback_step", "error_feedback_step", "scaled_sign", "top1"]

Compress = Callable[[torch.Tensor], torch.Tensor]


@reference("error_feedback_step")
def error_feedback_step(grads: list, residuals: list, compress: Compress) -> torch.Tensor:
    """Each rank r sends compress(g_r + e_r) and keeps what it did not send, e_r <- c_r - C(c_r), in place;
    every rank receives the mean of what was sent."""
    sent = []
    for grad, residual in zip(grads, residuals):
        corrected = grad + residual
        kept = compress(corrected)
        residual.copy_(corrected - kept)
        sent.append(kept)
    return torch.stack(sent).mean(dim=0)


def top1(tensor: torch.Tensor) -> torch.Tensor:
    """Keep the entry of largest magnitude, zero the rest (top-k with k = 1)."""
    out = torch.zeros_like(tensor)
    i = tensor.abs().argmax()
    out.view(-1)[i] = tensor.view(-1)[i]
    return out


def scaled_sign(tensor: torch.Tensor) -> torch.Tensor:
    """Every entry's sign times the mean magnitude (sign compression with one scale per tensor)."""
    return tensor.sign() * tensor.abs().mean()


def _no_memory(grads, residuals, compress):
    return sum(compress(g) for g in grads) / len(grads)


def _against_average(grads, residuals, compress):
    corrected = [g + e for g, e in zip(grads, residuals)]
    average = sum(compress(c) for c in corrected) / len(corrected)
    for e, c in zip(residuals, corrected):
        e.copy_(c - average)
    return average


def _per_rank(keep: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], Any]) -> Callable:
    """A step that sends C(g + e) from each rank and updates the residual by ``keep(e, g, c, sent)``."""

    def step(grads: list, residuals: list, compress: Compress) -> torch.Tensor:
        sent = []
        for g, e in zip(grads, residuals):
            c = g + e
            sent.append(compress(c))
            keep(e, g, c, sent[-1])
        return torch.stack(sent).mean(dim=0)

    return step


_raw_gradient = _per_rank(lambda e, g, c, s: e.copy_(g - s))  # the gradient alone, not the corrected one
_flipped = _per_rank(lambda e, g, c, s: e.copy_(s - c))
_piles_up = _per_rank(lambda e, g, c, s: e.add_(c - s))


def _shared(grads, residuals, compress):
    sent = []
    for g in grads:
        c = g + residuals[0]
        s = compress(c)
        residuals[0].copy_(c - s)
        sent.append(s)
    return sum(sent) / len(sent)


def _summed(grads, residuals, compress):
    return error_feedback_step(grads, residuals, compress) * len(grads)


def _by_two(grads, residuals, compress):
    return error_feedback_step(grads, residuals, compress) * len(grads) / 2


_SLIPS = [
    (
        "Nothing is remembered: residuals[r] never changes. Each rank compresses c = g + e (its gradient plus its "
        "residual) and keeps what it did not send in residuals[r], in place: `e = ...` makes a new tensor, "
        "e.copy_(c - C(c)) does not.",
        _no_memory,
    ),
    (
        "Each rank keeps what *it* did not send, c - C(c). c minus the average every rank receives is PyTorch "
        "PowerSGD's bookkeeping, not a per-rank compressor's: it also stores the other ranks' gradients.",
        _against_average,
    ),
    (
        "The residual is taken from the raw gradient: it must be c - C(c) with c = g + e, or the old residual is "
        "lost every step.",
        _raw_gradient,
    ),
    ("The residual's sign is flipped: keep c - C(c), what is still to be sent.", _flipped),
    (
        "The residual piles up: c already contains the old e, so replace it (copy_), do not add to it.",
        _piles_up,
    ),
    ("All ranks share one residual: each rank keeps its own, residuals[r].", _shared),
    ("You summed what the ranks sent: every rank receives their mean.", _summed),
]

#: The world sizes and gradient lengths the check runs: one entry (nothing to drop), three and seven.
WORLD_SIZES = (2, 3, 4)
LENGTHS = (1, 3, 7)
STEPS = 4


def _run(fn: Callable, world: int, compress: Compress) -> tuple[list, list]:
    """Four steps of ``fn`` on ``world`` ranks: what every rank received each step, and the residuals after each."""
    gen = torch.Generator().manual_seed(100 * world + 9)
    residuals = [[torch.zeros(n) for n in LENGTHS] for _ in range(world)]
    received, kept = [], []
    for _ in range(STEPS):
        grads = [[torch.randn(n, generator=gen) for n in LENGTHS] for _ in range(world)]
        for i in range(len(LENGTHS)):  # one call per tensor, as a hook sees one bucket at a time
            out = fn([g[i] for g in grads], [e[i] for e in residuals], compress)
            received.append(out)
        kept.append([e.clone() for rank in residuals for e in rank])
    return received, kept


def _close(a: tuple[list, list], b: tuple[list, list]) -> bool:
    def same(x: Any, y: torch.Tensor) -> bool:
        return isinstance(x, torch.Tensor) and x.shape == y.shape and torch.allclose(x, y, rtol=1e-5, atol=1e-6)

    return all(same(x, y) for x, y in zip(a[0], b[0])) and all(
        same(x, y) for xs, ys in zip(a[1], b[1]) for x, y in zip(xs, ys)
    )


def _problem_at(fn: Callable, world: int) -> str | None:
    for compress in (top1, scaled_sign):
        got = _run(fn, world, compress)
        if _close(got, _run(error_feedback_step, world, compress)):
            continue
        if not all(isinstance(x, torch.Tensor) for x in got[0]):
            return "return one tensor: the mean of what the ranks sent."
        for hint, slip in _SLIPS:
            if _close(got, _run(slip, world, compress)):
                return hint
        return (
            f"with {compress.__name__} the received means or the residuals differ from the reference's within "
            f"{STEPS} steps: c = g + e, send C(c), keep e = c - C(c) in place, return the mean of what was sent."
        )
    return None


def _verify(fn: Callable) -> str | None:
    right_at: list[int] = []
    for world in WORLD_SIZES:
        problem = _problem_at(fn, world)
        if problem is None:
            right_at.append(world)
            continue
        if right_at:
            return (
                f"right at {right_at[-1]} ranks, but at {world}: {problem} Something in your code holds only for "
                f"{right_at[-1]} ranks: a {right_at[-1]} where the number of ranks, len(grads), belongs."
            )
        return problem if world == WORLD_SIZES[0] else f"at {world} ranks: {problem}"
    return None


def check_error_feedback_step(attempt: Any) -> Outcome:
    """``error_feedback_step(grads, residuals, compress)`` against the reference, four steps at 2, 3 and 4 ranks,
    on tensors of 1, 3 and 7 entries, with top-1 and scaled sign.

    Wrong answers it recognises, each told by its own hint: no memory, or a residual rebound, not updated in place
    (both "Nothing is remembered"); the residual against the average ("PowerSGD's bookkeeping"); the raw
    gradient's residual ("raw gradient"); a flipped sign ("sign is flipped"); a residual added to ("piles up"); one
    residual for all ranks ("share one residual"); the sum for the mean ("You summed"); a fixed number of ranks
    ("right at 2 ranks, but at 3"). Anything else gets the general hint ("differ from the reference's").
    """
    return check_function(
        "error_feedback_step",
        attempt,
        _verify,
        "Four steps at 2, 3 and 4 ranks, with top-1 and scaled sign: what every rank received, and what each kept.",
        later=NOTHING_LATER,
    )

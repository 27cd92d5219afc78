"""Notebook 12's exercise: write DiLoCo's outer step. The check runs it on fixed pseudo-gradients of three ranks
for three outer steps and tells apart the usual slips: averaging the parameters (local SGD's step, not DiLoCo's),
the pseudo-gradient's sign, plain momentum instead of Nesterov's, no momentum at all, and the paper's lr and
momentum hard-coded (it runs with two settings)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .checking import NOTHING_LATER, Outcome, check_function, reference

__all__ = ["check_outer_step", "outer_step"]


@reference("outer_step")
def outer_step(global_params: list, local_params: list, buffers: list, lr: float = 0.7, momentum: float = 0.9) -> None:
    """In place: Δ = mean over ranks of (θ_global - θ_local), then SGD with Nesterov momentum on θ_global
    (``torch.optim.SGD(nesterov=True)``: b = m b + Δ, θ -= lr (Δ + m b))."""
    for i, (theta, buf) in enumerate(zip(global_params, buffers)):
        delta = sum(theta - rank[i] for rank in local_params) / len(local_params)
        buf.mul_(momentum).add_(delta)
        theta.sub_(lr * (delta + momentum * buf))


def _variant(step: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, list, float, float], None]):
    def run(global_params, local_params, buffers, lr=0.7, momentum=0.9) -> None:
        for i, (theta, buf) in enumerate(zip(global_params, buffers)):
            step(theta, buf, sum(theta - rank[i] for rank in local_params) / len(local_params),
                 [rank[i] for rank in local_params], lr, momentum)  # fmt: skip

    return run


def _averaged_parameters(theta, buf, delta, mine, lr, momentum) -> None:
    theta.copy_(sum(mine) / len(mine))


def _wrong_sign(theta, buf, delta, mine, lr, momentum) -> None:
    buf.mul_(momentum).sub_(delta)
    theta.sub_(lr * (-delta + momentum * buf))


def _heavy_ball(theta, buf, delta, mine, lr, momentum) -> None:
    buf.mul_(momentum).add_(delta)
    theta.sub_(lr * buf)


def _no_momentum(theta, buf, delta, mine, lr, momentum) -> None:
    theta.sub_(lr * delta)


def _summed(global_params, local_params, buffers, lr=0.7, momentum=0.9) -> None:
    for i, (theta, buf) in enumerate(zip(global_params, buffers)):
        delta = sum(theta - rank[i] for rank in local_params)  # not divided by the number of ranks
        buf.mul_(momentum).add_(delta)
        theta.sub_(lr * (delta + momentum * buf))


def _buffer_not_kept(global_params, local_params, buffers, lr=0.7, momentum=0.9) -> None:
    for i, (theta, buf) in enumerate(zip(global_params, buffers)):
        delta = sum(theta - rank[i] for rank in local_params) / len(local_params)
        buf = momentum * buf + delta  # a new tensor: buffers[i] never changes
        theta.sub_(lr * (delta + momentum * buf))


def _not_in_place(global_params, local_params, buffers, lr=0.7, momentum=0.9) -> None:
    for i, (theta, buf) in enumerate(zip(global_params, buffers)):
        delta = sum(theta - rank[i] for rank in local_params) / len(local_params)
        buf.mul_(momentum).add_(delta)
        theta = theta - lr * (delta + momentum * buf)  # a new tensor: global_params[i] never changes  # noqa: F841


_AVERAGED = (
    "You set θ_global to the ranks' mean parameters: that is local SGD's step. DiLoCo averages the "
    "pseudo-gradients Δ = θ_global - θ_local and lets an outer optimizer step on them."
)
_SIGN = (
    "Your θ_global moves away from the ranks: the pseudo-gradient is θ_global - θ_local (it points uphill, like a "
    "gradient), and the step subtracts it."
)
_SLIPS = [
    (_AVERAGED, _variant(_averaged_parameters)),
    (_SIGN, _variant(_wrong_sign)),
    ("That is plain (heavy-ball) momentum, θ -= lr b. Nesterov looks ahead: θ -= lr (Δ + m b).", _variant(_heavy_ball)),
    ("No momentum: keep a buffer per tensor, b = m b + Δ, and use it.", _variant(_no_momentum)),
    (
        "You summed the pseudo-gradients over the ranks: Δ is their mean, so that the step does not grow with the "
        "number of ranks.",
        _summed,
    ),
    (
        "Your momentum buffer does not carry over from one outer step to the next: `buf = ...` makes a new "
        "tensor. Update buffers[i] in place (buf.mul_(m).add_(Δ)).",
        _buffer_not_kept,
    ),
    (
        "θ_global did not change: `theta = theta - ...` makes a new tensor and leaves global_params as it was. "
        "Update the tensors in place (theta.sub_(...)).",
        _not_in_place,
    ),
]


def _inputs() -> tuple[list, list]:
    gen = torch.Generator().manual_seed(11)
    shapes = [(4, 3), (3,)]
    global_params = [torch.randn(s, generator=gen) for s in shapes]
    ranks = [[p + 0.1 * torch.randn(p.shape, generator=gen) for p in global_params] for _ in range(3)]
    return global_params, ranks


#: The outer learning rate and momentum the check uses: the paper's, and another pair (a step that hard-codes the
#: paper's values passes the first only).
SETTINGS = ((0.7, 0.9), (0.3, 0.5))


def _run(fn: Callable, lr: float, momentum: float, rounds: int = 3) -> list:
    global_params, ranks = _inputs()
    buffers = [torch.zeros_like(p) for p in global_params]
    for r in range(rounds):  # each round the ranks end their inner steps at other points
        local = [[p - 0.01 * (r + 1) * (k + 1) for p in rank] for k, rank in enumerate(ranks)]
        fn(global_params, local, buffers, lr=lr, momentum=momentum)
    return global_params


def _close(a: list, b: list) -> bool:
    return all(x.shape == y.shape and torch.allclose(x, y, rtol=1e-6, atol=1e-7) for x, y in zip(a, b))


def _verify(fn: Callable) -> str | None:
    for lr, momentum in SETTINGS:
        got = _run(fn, lr, momentum)
        if _close(got, _run(outer_step, lr, momentum)):
            continue
        for hint, slip in _SLIPS:
            if _close(got, _run(slip, lr, momentum)):
                return hint
        if (lr, momentum) != SETTINGS[0] and _close(got, _run(outer_step, *SETTINGS[0])):
            return (
                f"Right with lr=0.7 and momentum=0.9, wrong with lr={lr} and momentum={momentum}: use the lr and "
                "momentum your function is given, not the paper's values."
            )
        return (
            f"after three outer steps (lr={lr}, momentum={momentum}) θ_global is not the reference's: Δ, then "
            "b = m b + Δ, then θ -= lr (Δ + m b)."
        )
    return None


def check_outer_step(attempt: Any) -> Outcome:
    """``outer_step(global_params, local_params, buffers, lr, momentum)``, in place, against the reference, with
    two settings of lr and momentum.

    Wrong answers it recognises, each told by its own hint: the ranks' parameters averaged ("local SGD's step");
    the pseudo-gradient's sign flipped ("moves away from the ranks"); heavy-ball momentum ("heavy-ball"); no
    momentum ("No momentum"); the pseudo-gradients summed, not averaged ("You summed"); a buffer rebound, not
    updated in place ("does not carry over"); θ rebound, not updated in place ("did not change"); the paper's lr
    and momentum hard-coded, right on the first setting only ("use the lr and momentum your function is given").
    Anything else gets the general hint ("θ_global is not the reference's").
    """
    return check_function(
        "outer_step",
        attempt,
        _verify,
        "Three outer steps on three ranks' pseudo-gradients, as torch.optim.SGD(nesterov=True) would take them, "
        "with two settings of lr and momentum.",
        later=NOTHING_LATER,
    )

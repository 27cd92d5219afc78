"""The exercise of ``notebooks/problems_people_report.ipynb``: a check that every rank holds the same gradient,
cheap enough to keep in a training loop. It is run on real ranks at 2, 3 and 4: on gradients that agree, that
differ on every rank, and that differ on the last rank alone in one element, by a relative 1e-3 and by 1e-6;
every rank must reach the same, right verdict, sending at most :data:`MAX_BYTES` bytes."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .checking import WORLD_SIZES, Outcome, check_function, first_problem_by_world_size, reference

__all__ = ["CASES", "MAX_BYTES", "check_gradients_agree", "gradients_agree"]

#: What each case holds, and the verdict every rank must return for it.
CASES = {
    "the same gradient": True,
    "a gradient of its own": False,
    "the last rank's, changed in one element": False,
    "the last rank's, changed by a relative 1e-6 in its largest element": False,
}
#: Bytes a rank may hand to collectives per call: a few numbers, far below the gradient's.
MAX_BYTES = 64
_ELEMENTS = 2000
_CHANGE = 1e-3  # the last rank's element, relatively: a tolerance of 1e-5 on the norm already misses it
_TINY_CHANGE = 1e-6  # float32's norm of these 2000 elements rounds it away; float64's does not
#: The agreeing gradient's seed: its float64 norm n has (n + n + n) / 3 != n, so at 3 ranks a mean of the norms
#: compared with a rank's own says the ranks disagree when they agree (seed 0's happens to round back exactly).
_SAME_SEED = 4


@reference("gradients_agree")
def gradients_agree(grad):
    """The same tensor gives the same norm, bit for bit, on every rank: MAX equals MIN exactly when all agree."""
    norm = grad.detach().double().norm()
    both = torch.stack([norm, -norm])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)  # [max of the norms, -(min of the norms)]
    return bool(both[0] == -both[1])


def _case_gradient(case: str, rank: int, world_size: int) -> torch.Tensor:
    seed = rank if case == "a gradient of its own" else _SAME_SEED
    grad = torch.randn(_ELEMENTS, generator=torch.Generator().manual_seed(seed))
    if rank == world_size - 1 and case == "the last rank's, changed in one element":
        grad[7] *= 1 + _CHANGE
    if rank == world_size - 1 and case.startswith("the last rank's, changed by a relative"):
        grad[int(grad.abs().argmax())] *= 1 + _TINY_CHANGE
    return grad


def _rank_verdicts(ctx, fn) -> dict:
    """This rank's verdict on every case, and the most bytes it handed to collectives for one call."""
    from ..measure.payload import PayloadCounter

    counter = PayloadCounter.install()
    verdicts, most = {}, 0
    for case in CASES:
        counter.reset()
        counter.active = True
        verdicts[case] = bool(fn(_case_gradient(case, ctx.rank, ctx.world_size)))
        counter.active = False
        most = max(most, counter.payload_bytes)
    return {"verdicts": verdicts, "bytes": most}


def _problem_at(fn, ranks) -> str | None:
    results = ranks.run(_rank_verdicts, fn)
    for case, expected in CASES.items():
        said = [r["verdicts"][case] for r in results]
        if len(set(said)) > 1:
            split = ", ".join(f"rank {rank} says {verdict}" for rank, verdict in enumerate(said))
            return (
                f"given {case} on each rank, {split}: every rank must reach the same verdict, so every rank must "
                "learn the same thing from the others (all-reduce it), not only rank 0 or a neighbour."
            )
        if said[0] != expected and expected:
            return (
                f"given {case} on every rank it says {said[0]}: compare values every rank computes the same way, "
                "exactly (the norm all-reduced with MAX equals it all-reduced with MIN), not a sum that rounds."
            )
        if said[0] != expected and case == "a gradient of its own":
            return (
                f"given {case} on each rank it says {said[0]}: without communicating, a rank knows only its own "
                "gradient. Send something about it to the others."
            )
        if said[0] != expected and case == "the last rank's, changed in one element":
            return (
                f"given {case} it says {said[0]}: one element of one rank differs by a relative {_CHANGE:g}. "
                "Compare exactly (==), not within a tolerance, and in float64."
            )
        if said[0] != expected:
            return (
                f"given {case} it says {said[0]}: a float32 norm of 2000 elements rounds that change away. "
                "Take the norm in float64 (grad.double().norm()) and compare exactly."
            )
    sent = max(r["bytes"] for r in results)
    if sent > MAX_BYTES:
        return (
            f"the verdicts are right, but a rank sends {sent} bytes per call, for a gradient of {4 * _ELEMENTS}: "
            f"send a number or two (at most {MAX_BYTES} bytes), such as the gradient's norm."
        )
    return None


def check_gradients_agree(attempt: Any, cluster: Any = None, world_sizes=WORLD_SIZES) -> Outcome:
    """Your ``gradients_agree(grad) -> bool`` on real ranks at 2, 3 and 4 (``cluster``: a Cluster, or several, used
    for the sizes they have; the others get ranks started for them and stopped after).

    Wrong answers it recognises, each told by its own hint (its test file feeds them): no communication ("a rank
    knows only its own gradient"); rank 0's norm broadcast, or only the largest norm all-reduced ("every rank must
    reach the same verdict"); a tolerance ("not within a tolerance"); the norm in float32 ("in float64"); the mean
    of the norms compared with a rank's own ("not a sum that rounds", at 3 ranks); the whole gradient all-gathered
    ("send a number or two"). A verdict of False on equal gradients is told to compare exactly; one right at 2 ranks
    only is told so by :func:`.checking.first_problem_by_world_size`.
    """
    return check_function(
        "gradients_agree",
        attempt,
        lambda fn: first_problem_by_world_size(lambda ranks: _problem_at(fn, ranks), cluster, world_sizes),
        f"Every rank reached the right verdict on all {len(CASES)} cases at "
        f"{', '.join(map(str, world_sizes))} ranks, sending at most {MAX_BYTES} bytes.",
        later="Nothing later in the chapter depends on it.",
    )

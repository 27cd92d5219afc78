"""Notebook 2's exercises: how many buckets DDP's first step uses, and an fp16 hook that divides late.

No ``from __future__ import annotations`` here: DDP compares a hook's return annotation with
``torch.futures.Future[torch.Tensor]`` itself, and a string annotation would fail that check.

The hook check runs the learner's hook inside real DDP on two ranks, on gradients made to order
(ordinary values, values near float16's largest, values near its smallest subnormal), next to the
reference and the two usual mistakes, so a wrong hook gets a hint that names its mistake.
"""

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from .checking import Outcome, check_function, check_prediction, reference, whole_number_problem

__all__ = ["CASES", "check_first_step_buckets", "check_fp16_divide_after", "fp16_divide_after", "run_hooks_on_cases"]

# -- prediction: buckets at the first step -----------------------------------------------------------


def check_first_step_buckets(prediction: Any, seen: list[dict]) -> Outcome:
    """How many buckets the hook saw at step 0 (the answer is read from what the hook recorded).

    Wrong answers it recognises, each told by its own hint (none says the answer):

    - the number of buckets the later steps use, after the rebuild: "once DDP has rebuilt them";
    - one bucket per parameter (counted from the step-0 rows' "parameters"): "one bucket per parameter";
    - 0: "the hook was called at step 0";
    - any other count, such as the fp32 bytes over bucket_cap_mb: the general hint, "compute_bucket_size_limits".

    Malformed answers get a clear message instead: not a whole number (a str, a bool, a fraction) or below 0.
    """
    answer = sum(1 for row in seen if row["step"] == 0)
    later = [sum(1 for row in seen if row["step"] == step) for step in sorted({row["step"] for row in seen} - {0})]
    parameters = sum(
        len(str(row["parameters"]).split(", ")) for row in seen if row["step"] == 0 and "parameters" in row
    )
    slips = [(0, "The hook was called at step 0: every step's gradients reach it, in some number of buckets.")]
    if later:
        slips.append(
            (
                later[0],
                "That is how many buckets the later steps use, once DDP has rebuilt them in the order gradients "
                "arrived: what can DDP know about that order before the first backward?",
            )
        )
    if parameters:
        slips.append(
            (
                parameters,
                "That is one bucket per parameter: DDP groups gradients into buckets to make fewer, larger calls. "
                "What size limit does the first bucketing use?",
            )
        )
    return check_prediction(
        "first_step_buckets",
        prediction,
        answer,
        "Before the first backward DDP does not know in which order gradients will become ready. Read "
        "compute_bucket_size_limits in torch/nn/parallel/distributed.py: what limit does it use for the first "
        "bucketing when find_unused_parameters is False?",
        "DDP puts every parameter in one bucket for the first step (its limit is sys.maxsize unless "
        "find_unused_parameters=True), records the order in which gradients arrive, and rebuilds the buckets "
        "once, in that order, within bucket_cap_mb.",
        slips=[(value, hint) for value, hint in slips if value != answer],
        malformed=lambda attempt: whole_number_problem(attempt, "a number of buckets"),
    )


# -- fp16 all-reduce that divides after the sum ---------------------------------------------------------


@reference("fp16_divide_after")
def fp16_divide_after(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """Cast to float16, all-reduce the sum, then divide by the world size in float32."""
    buffer = bucket.buffer()
    compressed = buffer.to(torch.float16)
    future = dist.all_reduce(compressed, async_op=True).get_future()

    def decompress(fut):
        buffer.copy_(fut.value()[0])  # the float16 sum, back to float32
        return buffer.div_(dist.get_world_size())

    return future.then(decompress)


def _divide_in_float16_after(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """Also right: divide the float16 sum in float16, then cast back (with W = 3 the last bit can differ)."""
    buffer = bucket.buffer()
    future = dist.all_reduce(buffer.to(torch.float16), async_op=True).get_future()
    return future.then(lambda fut: buffer.copy_(fut.value()[0].div_(dist.get_world_size())))


def _sum_without_dividing(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """A usual mistake: the float16 sum, never divided."""
    buffer = bucket.buffer()
    future = dist.all_reduce(buffer.to(torch.float16), async_op=True).get_future()
    return future.then(lambda fut: buffer.copy_(fut.value()[0]))


def _divide_twice(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """Another: divides before the all-reduce and again after it, the mean divided by W once more."""
    buffer = bucket.buffer()
    world = dist.get_world_size()
    future = dist.all_reduce(buffer.to(torch.float16).div_(world), async_op=True).get_future()
    return future.then(lambda fut: buffer.copy_(fut.value()[0]).div_(world))


#: Each case gives every rank its gradient (rank r gets row r % 2). float16's largest finite value is
#: 65504 and its smallest subnormal 2**-24: the sums of "huge" overflow, halves of "tiny" underflow.
CASES: dict[str, list[list[float]]] = {
    "ordinary": [
        [0.0123, -0.0456, 0.25, -1.5, 3.0e-3, 7.0e-4, -0.031, 0.0],
        [0.0101, 0.0456, -0.125, -0.75, 1.0e-3, 6.5e-4, 0.062, 2.0e-3],
    ],
    "huge": [[40000.0, 60000.0, -50000.0, 30000.0], [40000.0, 60000.0, -50000.0, 30000.0]],
    "tiny": [[2.0**-24, 3 * 2.0**-24, 2.0**-23, 5 * 2.0**-24], [2.0**-24, 2.0**-24, 2.0**-23, 3 * 2.0**-24]],
}


class _OneParameter(torch.nn.Module):
    """forward(c) = weight * c, so d(sum)/d(weight) = c: each rank's gradient is exactly its c."""

    def __init__(self, n: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return self.weight * c


def _recording(original, dtypes: list[str]):
    """``original`` (dist.all_reduce), noting the dtype of every tensor handed to it."""

    def all_reduce(tensor, *args, **kwargs):
        dtypes.append(str(tensor.dtype).replace("torch.", ""))
        return original(tensor, *args, **kwargs)

    return all_reduce


def run_hooks_on_cases(ctx, hooks: dict, cases: dict) -> dict:
    """On every rank: for each hook and case, one DDP backward whose local gradient is the case's row.

    Returns, per hook, the gradient DDP left in ``.grad`` for each case, the dtypes the hook handed to
    ``all_reduce``, or the error it raised (as text: a notebook gets data back, not a crash).
    """
    out: dict[str, Any] = {}
    original = dist.all_reduce
    for name, hook in hooks.items():
        dtypes: list[str] = []
        grads, error = {}, None
        dist.all_reduce = _recording(original, dtypes)
        try:
            for case, rows in cases.items():
                c = torch.tensor(rows[ctx.rank % len(rows)], dtype=torch.float32)
                model = _OneParameter(len(c))
                ddp = DDP(model)
                ddp.register_comm_hook(None, hook)
                ddp(c).sum().backward()
                assert model.weight.grad is not None
                grads[case] = model.weight.grad.clone()
        except Exception as exc:  # the learner's hook raised: report it, keep the ranks alive
            error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        finally:
            dist.all_reduce = original
        out[name] = {"grads": grads, "dtypes": sorted(set(dtypes)), "error": error}
    return out


def _equal(a: dict, b: dict, case: str) -> bool:
    return case in a and case in b and a[case].shape == b[case].shape and torch.equal(a[case], b[case])


def _verify_divide_after(hook, cluster=None, world_size: int = 2) -> str | None:
    from ..launcher import launch

    hooks = {
        "yours": hook,
        "reference": fp16_divide_after,
        "reference_in_float16": _divide_in_float16_after,
        "divide_first": default_hooks.fp16_compress_hook,
        "no_divide": _sum_without_dividing,
        "divide_twice": _divide_twice,
    }
    if cluster is not None:
        ranks = cluster.run(run_hooks_on_cases, hooks, CASES, timeout_s=60)
    else:
        ranks = launch(run_hooks_on_cases, hooks, CASES, world_size=world_size, timeout_s=60)
    mine, ref = ranks[0]["yours"], ranks[0]["reference"]
    if mine["error"]:
        return f"Inside DDP your hook raised {mine['error']}"
    if "float16" not in mine["dtypes"] and "bfloat16" in mine["dtypes"]:
        return (
            "Your hook handed bfloat16 to all_reduce: as many bytes as float16, but 8 significand bits instead of "
            "11, and the exercise is about float16's overflow and underflow. Cast the bucket to torch.float16."
        )
    if "float16" not in mine["dtypes"]:
        return (
            f"Your hook handed {', '.join(mine['dtypes']) or 'nothing'} to all_reduce: cast the bucket to "
            "float16 first, so that half the bytes travel."
        )
    if any(not _equal(r["yours"]["grads"], mine["grads"], case) for r in ranks[1:] for case in CASES):
        return "The ranks ended with different gradients: every rank must do the same arithmetic on the same sum."
    alt = ranks[0]["reference_in_float16"]["grads"]
    wrong = [c for c in CASES if not (_equal(mine["grads"], ref["grads"], c) or _equal(mine["grads"], alt, c))]
    if not wrong:
        return None
    if all(_equal(mine["grads"], ranks[0]["divide_first"]["grads"], case) for case in CASES):
        return (
            "Your hook gives exactly PyTorch's numbers (fp16_compress_hook), which divides before the all-reduce. "
            "Move the division after the sum."
        )
    if all(_equal(mine["grads"], ranks[0]["no_divide"]["grads"], case) for case in CASES):
        return "Your result is the sum over ranks, W times the mean: divide the reduced tensor by the world size."
    if all(_equal(mine["grads"], ranks[0]["divide_twice"]["grads"], case) for case in CASES):
        return (
            "Your hook divides by W twice, before the all-reduce and after it: the mean over W once more. Divide "
            "once, after the sum."
        )
    case = wrong[0]
    got = mine["grads"].get(case)
    return (
        f"On the {case!r} gradients your hook leaves {None if got is None else got.tolist()} in .grad, which is not "
        "the float16 sum divided by W: check the arithmetic (cast to float16, all-reduce the sum, divide by the world "
        "size) and what the future returns (the bucket's tensor, float32, same shape)."
    )


def _verify_on_two_world_sizes(hook, cluster=None) -> str | None:
    """On the notebook's ranks, then on 3 fresh ones: a hook that divides by a hard-coded 2 fails the second."""
    problem = _verify_divide_after(hook, cluster)
    if problem is None and (cluster is None or cluster.world_size != 3):
        problem = _verify_divide_after(hook, None, world_size=3)
        if problem is not None:
            problem = f"On 3 ranks: {problem} (divide by dist.get_world_size(), not by a number)"
    return problem


def check_fp16_divide_after(attempt, cluster=None) -> Outcome:
    """Your hook inside DDP on two ranks, then three, on ordinary, huge and tiny gradients, beside the reference.

    Wrong answers it recognises, each told by its own hint: PyTorch's fp16_compress_hook, which divides first
    ("divides before the all-reduce"); the sum never divided ("W times the mean"); float32 on the wire ("cast the
    bucket to float16"); bfloat16 on the wire ("8 significand bits"); a division by W both before and after
    ("divides by W twice"); a hard-coded 2, right on two ranks only ("On 3 ranks"); ranks that do different
    arithmetic ("different gradients"); a hook that raises ("Inside DDP your hook raised"). Anything else gets the
    general hint, the gradient it left on one case ("not the float16 sum divided by W").
    """
    return check_function(
        "fp16_divide_after",
        attempt,
        lambda fn: _verify_on_two_world_sizes(fn, cluster),
        "Bit for bit the reference on ordinary, huge and tiny gradients, on 2 and 3 ranks, float16 on the wire, "
        "the ranks agree.",
    )

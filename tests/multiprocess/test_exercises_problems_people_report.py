"""The reported-problems chapter's exercise: a check that the ranks agree, fed the stub, the right answer and the
slips its hints name, at 2, 3 and 4 ranks."""

import pytest
import torch
import torch.distributed as dist

from commhooks_lab import Cluster
from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import problems_people_report as exercise

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


@pytest.fixture(scope="module")
def clusters():
    with Cluster(world_size=2) as two, Cluster(world_size=3) as three, Cluster(world_size=4) as four:
        yield [two, three, four]


def stub(grad):
    raise NotImplementedError


def silent(grad):  # never communicates
    return True


def rank0s_view(grad):  # everyone compares with rank 0's norm: only the rank that differs notices
    norm = grad.double().norm()
    theirs = norm.clone()
    dist.broadcast(theirs, src=0)
    return bool(norm == theirs)


def largest_only(grad):  # the ranks that hold the largest norm say True, the others False
    norm = grad.double().norm()
    most = norm.clone()
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return bool(most == norm)


def tolerant(grad):
    norm = grad.double().norm()
    both = torch.stack([norm, -norm])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return bool(torch.isclose(both[0], -both[1]))


def in_float32(grad):  # the reference's exact comparison, on a float32 norm
    norm = grad.norm()
    both = torch.stack([norm, -norm])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return bool(both[0] == -both[1])


def mean_of_norms(grad):  # the average norm against a rank's own: the sum rounds at 3 ranks
    norm = grad.double().norm()
    total = norm.clone()
    dist.all_reduce(total)
    return bool(total / dist.get_world_size() == norm)


def gathered(grad):  # right verdicts, the whole gradient sent
    every = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
    dist.all_gather(every, grad)
    return all(torch.equal(every[0], g) for g in every)


def test_the_stub_is_not_attempted_and_starts_no_ranks():
    outcome = exercise.check_gradients_agree(stub)
    assert outcome.status == NOT_ATTEMPTED and "Nothing later" in outcome.message


def test_the_reference_passes_at_every_size(clusters):
    outcome = exercise.check_gradients_agree(exercise.gradients_agree, clusters)
    assert outcome.status == RIGHT and "2, 3, 4 ranks" in outcome.message


@pytest.mark.parametrize(
    ("slip", "hint"),
    [
        (silent, "a rank knows only its own gradient"),
        (rank0s_view, "every rank must reach the same verdict"),
        (largest_only, "every rank must reach the same verdict"),
        (tolerant, "not within a tolerance"),
        (in_float32, "in float64"),
        (mean_of_norms, "not a sum that rounds"),
        (gathered, "send a number or two"),
    ],
    ids=lambda v: getattr(v, "__name__", "hint"),
)
def test_each_slip_gets_its_own_hint(clusters, slip, hint):
    outcome = exercise.check_gradients_agree(slip, clusters)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message

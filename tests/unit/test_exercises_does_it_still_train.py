"""Notebook 9's exercise check on its three paths: not attempted, wrong (the slips it names, at 2, 3 and 4 ranks),
right (also when written another way)."""

import pytest
import torch

from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import does_it_still_train as ex


def stub(grads, residuals, compress):
    raise NotImplementedError


def no_memory(grads, residuals, compress):
    return sum(compress(g) for g in grads) / len(grads)


def rebound(grads, residuals, compress):
    sent = []
    for g, e in zip(grads, residuals):
        c = g + e
        sent.append(compress(c))
        e = c - sent[-1]  # noqa: F841
    return sum(sent) / len(sent)


def against_the_average(grads, residuals, compress):  # the glossary's old e = c - h
    corrected = [g + e for g, e in zip(grads, residuals)]
    average = sum(compress(c) for c in corrected) / len(corrected)
    for e, c in zip(residuals, corrected):
        e.copy_(c - average)
    return average


def raw_gradient(grads, residuals, compress):
    sent = []
    for g, e in zip(grads, residuals):
        sent.append(compress(g + e))
        e.copy_(g - sent[-1])
    return sum(sent) / len(sent)


def flipped(grads, residuals, compress):
    sent = []
    for g, e in zip(grads, residuals):
        c = g + e
        sent.append(compress(c))
        e.copy_(sent[-1] - c)
    return sum(sent) / len(sent)


def piles_up(grads, residuals, compress):
    sent = []
    for g, e in zip(grads, residuals):
        c = g + e
        sent.append(compress(c))
        e += c - sent[-1]
    return sum(sent) / len(sent)


def shared(grads, residuals, compress):
    sent = []
    for g in grads:
        c = g + residuals[0]
        sent.append(compress(c))
        residuals[0].copy_(c - sent[-1])
    return sum(sent) / len(sent)


def summed(grads, residuals, compress):
    sent = []
    for g, e in zip(grads, residuals):
        c = g + e
        sent.append(compress(c))
        e.copy_(c - sent[-1])
    return sum(sent)


def by_two(grads, residuals, compress):  # right at 2 ranks only
    sent = []
    for g, e in zip(grads, residuals):
        c = g + e
        sent.append(compress(c))
        e.copy_(c - sent[-1])
    return sum(sent) / 2


def by_three(grads, residuals, compress):  # wrong at 2 already
    return by_two(grads, residuals, compress) * 2 / 3


def uncompressed(grads, residuals, compress):  # sends c whole, keeps c - C(c): no slip the check names
    sent = []
    for g, e in zip(grads, residuals):
        c = g + e
        sent.append(c)
        e.copy_(c - compress(c))
    return sum(sent) / len(sent)


def a_list(grads, residuals, compress):
    return [compress(g) for g in grads]


def stacked(grads, residuals, compress):  # right, written another way
    corrected = torch.stack(grads) + torch.stack(residuals)
    kept = torch.stack([compress(c) for c in corrected])
    for e, c, k in zip(residuals, corrected, kept):
        e.copy_(c - k)
    return kept.mean(dim=0)


def test_error_feedback_step_not_attempted_hands_on_the_reference(capsys):
    outcome = ex.check_error_feedback_step(stub)
    assert outcome.status == NOT_ATTEMPTED and outcome.value is ex.error_feedback_step
    assert "not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    "attempt, hint",
    [
        (no_memory, "Nothing is remembered"),
        (rebound, "Nothing is remembered"),
        (against_the_average, "PowerSGD's bookkeeping"),
        (raw_gradient, "raw gradient"),
        (flipped, "sign is flipped"),
        (piles_up, "piles up"),
        (shared, "share one residual"),
        (summed, "You summed"),
        (by_two, "right at 2 ranks, but at 3"),
        (by_three, "differ from the reference's"),
        (uncompressed, "differ from the reference's"),
        (a_list, "return one tensor"),
        (lambda grads, residuals, compress: 1 / 0, "ZeroDivisionError"),
    ],
    ids=lambda x: x.__name__ if callable(x) else "",
)
def test_error_feedback_step_wrong_attempts_get_their_hint(attempt, hint):
    outcome = ex.check_error_feedback_step(attempt)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert outcome.value is ex.error_feedback_step


def test_a_world_size_written_as_a_number_is_caught_at_the_size_after():
    def right_at_two_and_three(grads, residuals, compress):  # divides by 3 where the world size belongs, at 4
        mean = ex.error_feedback_step(grads, residuals, compress)
        return mean * len(grads) / 3 if len(grads) == 4 else mean

    outcome = ex.check_error_feedback_step(right_at_two_and_three)
    assert outcome.status == WRONG and "right at 3 ranks, but at 4" in outcome.message, outcome.message


@pytest.mark.parametrize("attempt", [ex.error_feedback_step, stacked], ids=["reference", "stacked"])
def test_error_feedback_step_right_attempts_pass_and_are_handed_on(attempt):
    outcome = ex.check_error_feedback_step(attempt)
    assert outcome.status == RIGHT and outcome.value is attempt, outcome.message


def test_the_sum_of_what_was_sent_is_the_sum_of_the_gradients_less_the_residual():
    """Error feedback's identity, which notebook 9's worked number shows: nothing is lost, only delayed."""
    gen = torch.Generator().manual_seed(3)
    residuals = [torch.zeros(5) for _ in range(3)]
    total_grads, total_received = torch.zeros(5), torch.zeros(5)
    for _ in range(6):
        grads = [torch.randn(5, generator=gen) for _ in range(3)]
        total_grads += sum(grads) / 3
        total_received += ex.error_feedback_step(grads, residuals, ex.top1)
    assert torch.allclose(total_received, total_grads - sum(residuals) / 3, atol=1e-6)
    assert sum(residuals).abs().sum() > 0  # something is still held back: the identity is not trivially 0 = 0

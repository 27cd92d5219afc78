"""Notebook 8's exercise checks on their three paths: not attempted, wrong (plausible wrong algorithms), right."""

import pytest

from commhooks_lab import exercises
from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import when_compression_pays_off as payoff
from commhooks_lab.studies import network as netmodel


def stub(allreduce_bytes, allgather_bytes, world_size):
    raise NotImplementedError


def same_factor_for_both(allreduce_bytes, allgather_bytes, world_size):  # "a ring moves 2(W-1)/W of everything"
    return 2 * (world_size - 1) / world_size * (allreduce_bytes + allgather_bytes)


def forgot_the_two_passes(allreduce_bytes, allgather_bytes, world_size):
    return (world_size - 1) / world_size * allreduce_bytes + (world_size - 1) * allgather_bytes


def gathers_every_copy(allreduce_bytes, allgather_bytes, world_size):  # counts its own payload too
    return 2 * (world_size - 1) / world_size * allreduce_bytes + world_size * allgather_bytes


def forgot_to_add(allreduce_bytes, allgather_bytes, world_size):
    return max(2 * (world_size - 1) / world_size * allreduce_bytes, (world_size - 1) * allgather_bytes)


def right(allreduce_bytes, allgather_bytes, world_size):
    w = world_size
    return allreduce_bytes * (2 * w - 2) / w + allgather_bytes * (w - 1)


def test_link_bytes_check_on_its_three_paths(capsys):
    outcome = payoff.check_link_bytes(stub)
    assert outcome.status == NOT_ATTEMPTED and outcome.value is payoff.link_bytes
    assert "not attempted yet" in capsys.readouterr().out
    wrong = payoff.check_link_bytes(same_factor_for_both)
    assert wrong.status == WRONG and "all-gather term" in wrong.message and wrong.value is payoff.link_bytes
    assert "all-reduce term" in payoff.check_link_bytes(forgot_the_two_passes).message
    assert "*other*" in payoff.check_link_bytes(gathers_every_copy).message
    assert "add them" in payoff.check_link_bytes(forgot_to_add).message
    outcome = payoff.check_link_bytes(right)
    assert outcome.status == RIGHT and outcome.value is right


def test_link_bytes_hints_never_give_the_expected_number():
    message = payoff.check_link_bytes(same_factor_for_both).message
    assert "700" not in message  # link_bytes(0, 100, 8) = 700: the check says where to look, not what to get


def test_a_link_bytes_may_return_a_tensor_but_must_return_a_number():
    import torch

    def tensor(a, g, w):
        return torch.tensor(right(a, g, w), dtype=torch.float64)

    def nothing(a, g, w):
        print(a, g, w)

    def raises(a, g, w):
        return a / 0

    assert payoff.check_link_bytes(tensor).status == RIGHT
    assert "return a number of bytes" in payoff.check_link_bytes(nothing).message
    assert "your code raised ZeroDivisionError" in payoff.check_link_bytes(raises).message


def test_reference_is_netmodels_rule():
    for a, g, w in [(1000, 0, 8), (10, 3, 5)]:
        t = {"allreduce_bytes": a, "allgather_bytes": g}
        assert payoff.link_bytes(a, g, w) == netmodel.link_bytes(t, w)


@pytest.fixture(scope="module")
def gpt2():
    return netmodel.architectures(include_lab_models=False)["GPT-2 small"]


def test_crossing_world_size_is_where_topk_overtakes_fp16(gpt2):
    w = payoff.crossing_world_size(gpt2, ("topk", {"ratio": 0.01}), ("fp16", {}))
    assert w == 50
    topk, fp16 = netmodel.rule_traffic(gpt2, "topk", ratio=0.01), netmodel.rule_traffic(gpt2, "fp16")
    assert netmodel.link_bytes(topk, w) > netmodel.link_bytes(fp16, w)
    assert netmodel.link_bytes(topk, w - 1) <= netmodel.link_bytes(fp16, w - 1)
    assert payoff.crossing_world_size(gpt2, ("fp16", {}), ("allreduce", {})) is None  # never
    assert [payoff.nearest_choice(x) for x in (None, 12, 50, 200, 900)] == ["a", "b", "c", "c", "d"]


def test_crossing_prediction_on_its_three_paths(gpt2):
    outcome = payoff.check_crossing_prediction(None, gpt2)
    assert outcome.status == NOT_ATTEMPTED and outcome.value == "c"
    wrong = payoff.check_crossing_prediction("b", gpt2)  # plausible: "8 ranks is already a lot"
    assert wrong.status == WRONG and "ratio 1" in wrong.message and "50" not in wrong.message
    assert payoff.check_crossing_prediction("never", gpt2).status == WRONG
    right_answer = payoff.check_crossing_prediction("c", gpt2)
    assert right_answer.status == RIGHT and "W = 50" in right_answer.message


def test_reveal_shows_the_reference_only_on_request(capsys):
    exercises.reveal("link_bytes")
    assert "def link_bytes(" in capsys.readouterr().out

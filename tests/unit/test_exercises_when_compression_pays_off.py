"""Notebook 8's exercise checks on their three paths: not attempted, wrong (plausible wrong algorithms), right."""

import math

import pytest

from commhooks_lab import exercises
from commhooks_lab.exercises import NOT_ATTEMPTED, RIGHT, WRONG
from commhooks_lab.exercises import when_compression_pays_off as payoff
from commhooks_lab.studies import network as netmodel


def stub(world_size, latency_us, bandwidth_gbps):
    raise NotImplementedError


def one_message(world_size, latency_us, bandwidth_gbps):  # alpha = n / beta, the alpha-beta model of one message
    return latency_us * 1e-6 * bandwidth_gbps * 1e9 / 8


def twice_the_payload(world_size, latency_us, bandwidth_gbps):  # "a ring's bytes per link approach 2x the payload"
    w = world_size
    return (w - 1) * latency_us * 1e-6 * bandwidth_gbps * 1e9 / 8


def w_steps_per_pass(world_size, latency_us, bandwidth_gbps):  # 2W latency steps instead of 2(W-1)
    w = world_size
    return w * w / (w - 1) * latency_us * 1e-6 * bandwidth_gbps * 1e9 / 8


def latency_of_one_pass(world_size, latency_us, bandwidth_gbps):  # W-1 steps, the all-gather's, for an all-reduce
    return world_size / 2 * latency_us * 1e-6 * bandwidth_gbps * 1e9 / 8


def bytes_of_one_pass(world_size, latency_us, bandwidth_gbps):  # (W-1)/W of the payload, one pass's bytes
    return 2 * world_size * latency_us * 1e-6 * bandwidth_gbps * 1e9 / 8


def in_bits(world_size, latency_us, bandwidth_gbps):  # forgot that bandwidth_gbps counts bits
    return world_size * latency_us * 1e-6 * bandwidth_gbps * 1e9


def microseconds_as_milliseconds(world_size, latency_us, bandwidth_gbps):
    return world_size * latency_us * 1e-3 * bandwidth_gbps * 1e9 / 8


def squared(world_size, latency_us, bandwidth_gbps):  # no pattern a hint knows: the generic hint
    return world_size**2 * latency_us * 1e-6 * bandwidth_gbps * 1e9 / 8


def right(world_size, latency_us, bandwidth_gbps):
    seconds, bytes_per_second = latency_us / 1e6, bandwidth_gbps * 1e9 / 8
    return 2 * (world_size - 1) * seconds / (2 * (world_size - 1) / world_size) * bytes_per_second


def test_latency_bound_bytes_not_attempted_hands_on_the_reference(capsys):
    outcome = payoff.check_latency_bound_bytes(stub)
    assert outcome.status == NOT_ATTEMPTED and outcome.value is payoff.latency_bound_bytes
    assert "not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    "attempt, hint",
    [
        (one_message, "W times too small"),
        (twice_the_payload, "too small for few (half at W = 2)"),
        (w_steps_per_pass, "count the ring steps again"),
        (latency_of_one_pass, "both pay the latency"),
        (bytes_of_one_pass, "both passes, the reduce-scatter and the all-gather, move"),
        (in_bits, "counts gigabits per second"),
        (microseconds_as_milliseconds, "latency_us is in microseconds"),
        (squared, "write both terms for n bytes and set them equal"),
        (lambda w, a, b: 50_000.0, "for every case"),  # a hard-coded number, right at 8 ranks, 5 us, 10 Gbit/s
        (lambda w, a, b: w * 6250.0, "but not on"),  # 5 us and 10 Gbit/s hard-coded: right on those cases only
    ],
    ids=lambda x: x.__name__ if callable(x) else "",
)
def test_latency_bound_bytes_wrong_attempts_get_their_hint(attempt, hint):
    outcome = payoff.check_latency_bound_bytes(attempt)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert outcome.value is payoff.latency_bound_bytes
    assert "50,000" not in outcome.message and "W x alpha x beta" not in outcome.message  # hints never answer


def test_latency_bound_bytes_right_answers_pass():
    outcome = payoff.check_latency_bound_bytes(right)
    assert outcome.status == RIGHT and outcome.value is right
    assert "n* = W x alpha x beta" in outcome.message  # the formula is told once it is found, not before
    assert payoff.check_latency_bound_bytes(payoff.latency_bound_bytes).status == RIGHT


# -- part b: the all-reduce's time, which a reduce-scatter-only model gets wrong ------------------------------


def reduce_scatter_only(w, a, b, n):  # part a cannot tell it apart: it has the right n*
    return (w - 1) * a * 1e-6 + (w - 1) / w * n * 8 / (b * 1e9)


def ring_time(w, a, b, n):  # written another way
    alpha, beta = a / 1e6, b * 1e9 / 8
    return 2 * (w - 1) * (alpha + n / w / beta)


@pytest.mark.parametrize(
    "attempt, hint",
    [
        (reduce_scatter_only, "that is a reduce-scatter alone"),
        (lambda w, a, b, n: a * 1e-6 + n * 8 / (b * 1e9), "that is one message"),
        (lambda w, a, b, n: 2 * (w - 1) * (a * 1e-6 + n * 8 / (b * 1e9)), "each ring step moves one chunk"),
        (lambda w, a, b, n: a * 1e-6 + 2 * (w - 1) / w * n * 8 / (b * 1e9), "the latency is paid once"),
        (lambda w, a, b, n: 2 * (w - 1) * a * 1e-6 + 2 * (w - 1) / w * n / (b * 1e9), "counts bits"),
        (lambda w, a, b, n: 2 * (w - 1) * a + 2 * (w - 1) / w * n * 8 / (b * 1e9), "latency_us is in microseconds"),
        (lambda w, a, b, n: 2 * (w - 1) * a * 1e-6, "the latency term alone"),
        (lambda w, a, b, n: 2 * (w - 1) / w * n * 8 / (b * 1e9), "the bandwidth term alone"),
        (lambda w, a, b, n: 8.3e-5, "for every world size"),  # a constant
        (lambda w, a, b, n: 2 * (w - 1) * (a * 1e-6 + n / w * 8 / (b * 1e9)) * 1.1, "write the latency term"),
    ],
)
def test_allreduce_seconds_wrong_attempts_get_their_hint(attempt, hint):
    outcome = payoff.check_allreduce_seconds(attempt)
    assert outcome.status == WRONG and hint in outcome.message, outcome.message
    assert outcome.value is payoff.allreduce_seconds


def test_allreduce_seconds_right_answers_pass_and_the_reference_is_the_labs_model(capsys):
    def stub_b(w, a, b, n):
        raise NotImplementedError

    assert payoff.check_allreduce_seconds(stub_b).status == NOT_ATTEMPTED
    assert payoff.check_allreduce_seconds(ring_time).status == RIGHT
    for w, a, b, n in payoff._TIME_CASES:
        t = {"allreduce_bytes": n, "allgather_bytes": 0.0, "allreduce_calls": 1, "allgather_calls": 0}
        assert math.isclose(payoff.allreduce_seconds(w, a, b, n), netmodel.comm_seconds(t, w, b, a), rel_tol=1e-12)
    # the reduce-scatter-only model passes part a: that is why part b exists
    n_star = [(w, a, b) for w, a, b, _ in payoff._TIME_CASES]
    assert all(
        math.isclose(
            payoff.latency_bound_bytes(w, a, b),
            (w - 1) * a * 1e-6 / ((w - 1) / w * 8 / (b * 1e9)),
            rel_tol=1e-9,
        )
        for w, a, b in n_star
    )


def test_a_latency_bound_bytes_may_return_a_tensor_but_must_return_a_number():
    import torch

    def tensor(w, a, b):
        return torch.tensor(right(w, a, b), dtype=torch.float64)

    def nothing(w, a, b):
        print(w, a, b)

    def raises(w, a, b):
        return w / 0

    assert payoff.check_latency_bound_bytes(tensor).status == RIGHT
    assert "return a number of bytes" in payoff.check_latency_bound_bytes(nothing).message
    assert "your code raised ZeroDivisionError" in payoff.check_latency_bound_bytes(raises).message


def test_the_reference_is_where_the_network_models_two_terms_meet():
    """At n*, comm_seconds' latency term (no bytes) equals its bandwidth term (no latency), for W not only 2^k."""
    for w, latency_us, gbps in [(2, 5.0, 10.0), (7, 5.0, 10.0), (8, 1.0, 100.0), (100, 20.0, 200.0)]:
        n = payoff.latency_bound_bytes(w, latency_us, gbps)
        one = {"allreduce_bytes": n, "allgather_bytes": 0.0, "allreduce_calls": 1, "allgather_calls": 0}
        latency = netmodel.comm_seconds({**one, "allreduce_bytes": 0.0}, w, gbps, latency_us)
        bandwidth = netmodel.comm_seconds(one, w, gbps, 0.0)
        assert math.isclose(latency, bandwidth, rel_tol=1e-12), (w, latency, bandwidth)
    cnn_allreduce = 39_720  # notebook 8's measured fp32 payload of the digits CNN
    assert cnn_allreduce < payoff.latency_bound_bytes(8, 5.0, 10.0) == pytest.approx(50_000)


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


@pytest.mark.parametrize(
    "wrong, hint",
    [
        ("a", "can the first stay below the second for ever"),
        ("b", "Where is their ratio 1?"),
        ("d", "a value and its index"),
        ("never", "'never' is not one of the choices"),
        ("C", "spelt exactly so"),
        (50, "not the int 50"),  # the world size, not its letter
        (None, "no prediction made"),
    ],
)
def test_crossing_prediction_wrong_answers_get_their_own_hint(wrong, hint, gpt2):
    outcome = payoff.check_crossing_prediction(wrong, gpt2)
    assert outcome.status == (NOT_ATTEMPTED if wrong is None else WRONG) and hint in outcome.message, outcome.message
    assert "W = 50" not in outcome.message and "W/50" not in outcome.message
    right_answer = payoff.check_crossing_prediction("c", gpt2)
    assert right_answer.status == RIGHT and "W = 50" in right_answer.message


def test_reveal_shows_the_reference_only_on_request(capsys):
    exercises.reveal("latency_bound_bytes")
    assert "def latency_bound_bytes(" in capsys.readouterr().out
